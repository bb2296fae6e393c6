"""deploy/compose.yaml, deploy/k8s and deploy/systemd checked by the tools made for them (pinned in
pyproject's `deploy` extra; systemd-analyze from Debian's systemd): no cluster or init system needed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from podman_harness import ROOT, podman_env

pytestmark = pytest.mark.deploy
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def _tool(name: str, *args: str, cwd: Path = DEPLOY) -> subprocess.CompletedProcess[str]:
    exe = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert exe, f"{name} is missing: make test-deploy installs it"
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=podman_env()
    )


def test_compose_file_against_the_compose_spec() -> None:
    out = _tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", "compose.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_file_as_podman_compose_reads_it(tmp_path: Path) -> None:
    # podman-compose resolves secrets' files: give it a copy with throwaway ones.
    work = tmp_path / "deploy"
    shutil.copytree(DEPLOY, work, ignore=shutil.ignore_patterns("secrets"))
    (work / "secrets").mkdir()
    (work / "secrets" / "broker_password").write_text("pw")
    (work / "secrets" / "api_keys").write_text("k\n")
    out = _tool("podman-compose", "-f", "compose.yaml", "config", cwd=work)
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    services = config["services"]
    assert set(services) == {"rabbitmq", "model-init", "gateway", "worker"}
    assert services["worker"]["deploy"]["replicas"] == 2
    for name in ("gateway", "worker"):
        svc = services[name]
        assert svc["volumes"] == ["models:/models"] and "broker_password" in svc["secrets"]
        assert svc["environment"]["OUTPOST_BROKER_PASSWORD_FILE"] == "/run/secrets/broker_password"
        assert svc["depends_on"]["model-init"]["condition"] == "service_completed_successfully"
    assert "healthcheck" in services["gateway"] and "healthcheck" in services["rabbitmq"]


# Objects of operators' CRDs, validated against the schemas in tests/deploy/schemas instead.
CUSTOM = ("keda.yaml", "rabbitmq.yaml")


def _k8s_files() -> list[str]:
    return sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")


def test_kubernetes_manifests_against_the_api_schemas() -> None:
    core = [f for f in _k8s_files() if f not in CUSTOM]
    out = _tool("kubernetes-validate", "--strict", *core, cwd=DEPLOY / "k8s")
    assert out.returncode == 0 and "Couldn't find schema" not in out.stdout + out.stderr, out.stdout


def test_keda_objects_against_their_schema(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "keda.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"ScaledObject", "TriggerAuthentication"}
    schema = Path(__file__).parent / "schemas" / "keda-v1alpha1.json"
    for i, doc in enumerate(docs):
        one = tmp_path / f"keda-{i}.yaml"
        one.write_text(yaml.safe_dump(doc))
        out = _tool("check-jsonschema", "--schemafile", str(schema), str(one))
        assert out.returncode == 0, out.stdout + out.stderr


def test_rabbitmq_cluster_against_the_operators_schema(tmp_path: Path) -> None:
    """Three nodes, validated against the cluster operator's RabbitmqCluster CRD (v1beta1)."""
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "rabbitmq.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["RabbitmqCluster"]
    assert docs[0]["spec"]["replicas"] == 3
    schema = Path(__file__).parent / "schemas" / "rabbitmqcluster-v1beta1.json"
    one = tmp_path / "rabbitmq.yaml"
    one.write_text(yaml.safe_dump(docs[0]))
    out = _tool("check-jsonschema", "--schemafile", str(schema), str(one))
    assert out.returncode == 0, out.stdout + out.stderr
    bad = dict(docs[0], spec={**docs[0]["spec"], "replicas": -1, "service": {"type": "Ingress"}})
    one.write_text(yaml.safe_dump(bad))
    out = _tool("check-jsonschema", "--schemafile", str(schema), str(one))
    assert out.returncode != 0  # the schema does check what it says


def test_kustomization_ties_the_pieces_together() -> None:
    k8s = DEPLOY / "k8s"
    kust = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == _k8s_files()
    docs = [d for f in _k8s_files() for d in yaml.safe_load_all((k8s / f).read_text())]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    scaled = by_kind[("ScaledObject", "outpost-worker")]
    assert ("Deployment", scaled["spec"]["scaleTargetRef"]["name"]) in by_kind
    assert scaled["spec"]["triggers"][0]["type"] == "rabbitmq"
    secrets = {s["name"]: s["files"] for s in kust["secretGenerator"]}
    assert scaled["spec"]["triggers"][0]["authenticationRef"]["name"] in {
        n for (kind, n) in by_kind if kind == "TriggerAuthentication"
    }
    for name in ("outpost-gateway", "outpost-worker"):
        pod = by_kind[("Deployment", name)]["spec"]["template"]["spec"]
        # longer than the drain (OUTPOST_GRACE_PERIOD in the config map)
        grace = next(
            int(lit.split("=")[1]) for lit in kust["configMapGenerator"][0]["literals"] if "GRACE" in lit
        )
        assert pod["terminationGracePeriodSeconds"] > grace
        assert pod["securityContext"]["runAsNonRoot"] is True
        for vol in pod["volumes"]:
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secrets
    gateway = by_kind[("Deployment", "outpost-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for d in docs
        if d["kind"] == "PodDisruptionBudget"
    } == {"outpost-gateway", "outpost-worker"}


@pytest.mark.parametrize("role", ["serve", "gateway", "worker"])
def test_systemd_units_verify_and_are_hardened(role: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing (Debian's systemd package)")
    # verify wants ExecStart's binary to exist: point it at one that does.
    unit = tmp_path / f"outpost-{role}.service"
    text = (DEPLOY / "systemd" / unit.name).read_text()
    unit.write_text(text.replace("/opt/outpost/bin/outpost", "/bin/true"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    for setting in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes", "KillSignal=SIGTERM"):
        assert setting in text
    sec = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = float(sec.stdout.rsplit("Overall exposure level for", 1)[1].split(":")[1].split()[0])
    assert level <= 2.0, sec.stdout[-2000:]


def test_systemd_install_script_writes_unit_settings_and_secrets(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PREFIX": str(Path(sys.executable).parent.parent),  # a venv that has outpost: no install
        "ETC": str(tmp_path / "etc"),
        "UNITDIR": str(tmp_path / "units"),
        "OUTPOST_BROKER_PASSWORD": "s3cret",
    }
    (tmp_path / "units").mkdir()
    script = str(DEPLOY / "systemd" / "install.sh")
    out = subprocess.run(
        [script, "gateway", "--no-start"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    unit = (tmp_path / "units" / "outpost-gateway.service").read_text()
    assert f"ExecStart={env['PREFIX']}/bin/outpost gateway" in unit and f"{env['ETC']}/gateway.env" in unit
    assert (tmp_path / "etc" / "broker_password").read_text() == "s3cret"
    assert oct((tmp_path / "etc" / "api_keys").stat().st_mode & 0o777) == "0o600"
    assert "OUTPOST_BROKER=" in (tmp_path / "etc" / "gateway.env").read_text()
