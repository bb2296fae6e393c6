"""deploy/compose.cluster.yaml (the three-node RabbitMQ form, layered on deploy/compose.yaml) checked
by the compose spec's schema and as podman-compose merges the two files: three broker nodes that
name each other as peers and share one Erlang cookie, and a gateway and workers given every node."""

from __future__ import annotations

import re
import shutil
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_manifests import DEPLOY, _tool

pytestmark = pytest.mark.deploy
NODES = ("rabbitmq", "rabbitmq2", "rabbitmq3")


def test_cluster_file_against_the_compose_spec() -> None:
    out = _tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", "compose.cluster.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def _merged(tmp_path: Path) -> dict[str, Any]:
    work = tmp_path / "deploy"
    shutil.copytree(DEPLOY, work, ignore=shutil.ignore_patterns("secrets"))
    (work / "secrets").mkdir()
    for name, text in (("broker_password", "pw"), ("api_keys", "k\n"), ("erlang_cookie", "c")):
        (work / "secrets" / name).write_text(text)
    out = _tool("podman-compose", "-f", "compose.yaml", "-f", "compose.cluster.yaml", "config", cwd=work)
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = yaml.safe_load(out.stdout)
    return config


def test_three_nodes_that_cluster_with_each_other(tmp_path: Path) -> None:
    config = _merged(tmp_path)
    services = config["services"]
    assert set(services) == {*NODES, "model-init", "gateway", "worker"}
    assert config["secrets"]["erlang_cookie"]["file"] == "./secrets/erlang_cookie"
    volumes = set()
    for node in NODES:
        svc = services[node]
        assert svc["hostname"] == node  # the node is rabbit@<hostname>
        assert sorted(svc["secrets"]) == ["broker_password", "erlang_cookie"]  # each given once
        # nodes 2 and 3 are healthy once they run, i.e. have joined; node 1 once its runtime answers
        check = "ping" if node == NODES[0] else "check_running"
        assert svc["healthcheck"]["test"] == ["CMD", "rabbitmq-diagnostics", "-q", check]
        script = svc["entrypoint"][-1]
        peers = re.findall(r"classic_config\.nodes\.\d = rabbit@(\w+)", script)
        assert peers == list(NODES), script
        assert "/run/secrets/erlang_cookie /var/lib/rabbitmq/.erlang.cookie" in script
        assert script.rstrip().endswith("exec docker-entrypoint.sh rabbitmq-server")
        (volume,) = svc["volumes"]
        volumes.add(volume.split(":")[0])
    assert len(volumes) == 3  # a data volume per node
    for node in NODES[1:]:  # they join node 1 once it is up
        assert services[node]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"


def test_gateway_and_workers_are_given_every_node(tmp_path: Path) -> None:
    services = _merged(tmp_path)["services"]
    for name in ("gateway", "worker"):
        env = services[name]["environment"]
        hosts = [urllib.parse.urlsplit(u).hostname for u in env["OUTPOST_BROKER"].split(",")]
        assert hosts == list(NODES), env["OUTPOST_BROKER"]
        assert env["OUTPOST_BROKER_QUORUM_SIZE"] == str(len(NODES))
        assert env["OUTPOST_BROKER_PASSWORD_FILE"] == "/run/secrets/broker_password"
        assert {n for n, d in services[name]["depends_on"].items() if n in NODES} == set(NODES)
        assert all(services[name]["depends_on"][n]["condition"] == "service_healthy" for n in NODES)
    assert services["gateway"]["environment"]["OUTPOST_API_KEY_FILE"] == "/run/secrets/api_keys"


def test_the_flags_read_the_cluster_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The gateway's env as a process reads it: every node's address, each with the password."""
    from outpost.commands.broker import connect_urls
    from outpost.settings import BrokerSettings

    env = _merged(tmp_path)["services"]["gateway"]["environment"]
    password = tmp_path / "pw"
    password.write_text("secret")
    settings = BrokerSettings(
        broker=env["OUTPOST_BROKER"],
        broker_password_file=str(password),
        broker_quorum_size=int(env["OUTPOST_BROKER_QUORUM_SIZE"]),
    )
    urls = connect_urls(settings)
    assert [urllib.parse.urlsplit(u).netloc for u in urls] == [f"outpost:secret@{n}:5672" for n in NODES]
