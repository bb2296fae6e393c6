"""Several models through the cluster, with no broker and no model: a worker's heartbeat per model
(every model it serves, whether this one is loaded; an older heartbeat reads as one model, loaded),
the gateway's table by worker and model (routing views, limits, how many serve and hold each model,
the cards' counts), a pooled model's heartbeat before and after its load, the gateway's models from
-m and --models-dir, and the flags: --models-dir on all three commands, the pool's on serve and worker."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_backend import FakeCodec, FakeSource
from test_model_pool import answer

from outpost import cli
from outpost.cluster import wire
from outpost.cluster.gateway.fleet import WorkerTable
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.heartbeat import Heartbeat, decode_heartbeat, encode_heartbeat
from outpost.cluster.worker.served import ServedModel
from outpost.commands.gateway import gateway_models
from outpost.serving.model_pool import ModelPool, PoolLimits
from outpost.settings import GatewaySettings, ServeSettings, WorkerSettings


def _hb(worker: str, model: str, loaded: bool = True, n_ctx_seq: int = 512, **kw: Any) -> bytes:
    hb = Heartbeat(worker, model, 2, 0, n_ctx_seq=n_ctx_seq, models=("a", "b"), loaded=loaded, **kw)
    return encode_heartbeat(hb)


def test_a_heartbeat_names_every_model_and_says_whether_this_one_is_loaded() -> None:
    hb = Heartbeat("w1", "b", 2, 1, lane="outpost.lane.b.w1", models=("a", "b"), loaded=False)
    body = encode_heartbeat(hb)
    fields = json.loads(body)
    assert fields["v"] == wire.WIRE_VERSION == 1  # optional fields within v1: an older reader skips them
    assert fields["models"] == ["a", "b"] and fields["loaded"] is False
    assert decode_heartbeat(body) == hb and hb.served == ("a", "b")
    older = wire.dumps({"kind": "heartbeat", "id": "w0", "model": "a", "slots_total": 2, "slots_busy": 0})
    old = decode_heartbeat(older)
    assert old.served == ("a",) and old.loaded  # an older worker: its one model, loaded
    with pytest.raises(wire.WireError, match="malformed heartbeat"):
        decode_heartbeat(body.replace(b'"models":["a","b"]', b'"models":"a"'))


def test_the_gateway_keeps_each_model_of_a_worker_apart() -> None:
    table = WorkerTable(["a", "b"])
    assert table.heard(_hb("w1", "a", n_ctx_seq=100)) is not None
    assert table.heard(_hb("w1", "b", loaded=False, n_ctx_seq=200)) is not None
    assert table.heard(_hb("w2", "a")) is not None
    assert table.heard(_hb("w1", "c")) is None  # another model's: not this gateway's
    assert {v.worker_id for v in table.views("a")} == {"w1", "w2"}
    assert [v.worker_id for v in table.views("b")] == ["w1"]
    assert table.n_ctx_seq("a") == 100 and table.n_ctx_seq("b") == 200
    assert table.serving("a") == (2, 2) and table.serving("b") == (1, 0)
    listed = table.live_workers()
    assert sorted((w["id"], w["model"], w["loaded"]) for w in listed) == [
        ("w1", "a", True),
        ("w1", "b", False),
        ("w2", "a", True),
    ]
    assert all(w["models"] == ["a", "b"] for w in listed)
    # /v1/models' card of each model: how many live workers serve it and hold it loaded.
    link: Any = SimpleNamespace(fleet=table)
    facts = {"n_ctx_train": 2048}
    assert RemoteBackend(link, "b", FakeCodec(), facts).describe() == {
        "n_ctx_train": 2048,
        "workers": 1,
        "workers_loaded": 0,
    }
    assert RemoteBackend(link, "z", FakeCodec(), facts).describe()["workers"] == 0  # none: it waits


def test_a_pooled_models_heartbeat_before_and_after_its_first_request() -> None:
    async def go() -> None:
        pool = ModelPool({"a": FakeSource(), "b": FakeSource()}, PoolLimits(models_max=1))
        served = [ServedModel(name, model, 3) for name, model in pool.models.items()]
        for m in served:
            m.named_for("w1")
        a, b = served
        before = a.heartbeat("w1", False, 0, ("a", "b"))
        assert (before.model, before.slots_total, before.loaded) == ("a", 3, False)
        assert before.n_ctx_seq == 4096 and before.kv_cells == 0 and before.models == ("a", "b")
        assert before.lane == "outpost.lane.a.w1"
        assert await answer(pool.models["a"]) == "hello"
        assert a.heartbeat("w1", False, 1, ("a", "b")).loaded
        assert await answer(pool.models["b"]) == "hello"  # --models-max 1: a unloaded for it
        assert (a.loaded, b.loaded) == (False, True)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_the_gateways_models_are_its_m_files_and_its_models_dir(tmp_path: Path) -> None:
    one = tmp_path / "one.gguf"
    one.write_bytes(b"GGUF")
    folder = tmp_path / "dir"
    folder.mkdir()
    for name in ("two", "three"):
        shutil.copyfile(one, folder / f"{name}.gguf")
    models = gateway_models([str(one)], str(folder))
    assert models == {"one": str(one), "three": str(folder / "three.gguf"), "two": str(folder / "two.gguf")}
    shutil.copyfile(one, folder / "one.gguf")
    with pytest.raises(ValueError, match="same id: \\['one'\\]"):
        gateway_models([str(one)], str(folder))


def test_models_dir_is_on_all_three_commands_and_the_pools_flags_on_serve_and_worker(tmp_path: Path) -> None:
    parser = cli.build_parser()
    pool = ["--models-max", "2", "--sleep-idle-seconds", "5", "--model-load-timeout", "9"]
    for command, block in (("serve", ServeSettings), ("worker", WorkerSettings)):
        settings = block.from_args(parser.parse_args([command, "--models-dir", str(tmp_path), *pool]))
        assert settings.models_dir == str(tmp_path) and settings.models_max == 2
        assert (settings.sleep_idle_seconds, settings.model_load_timeout) == (5, 9.0)
    gateway = GatewaySettings.from_args(parser.parse_args(["gateway", "--models-dir", str(tmp_path)]))
    assert gateway.models_dir == str(tmp_path)
    with pytest.raises(SystemExit):
        parser.parse_args(["gateway", "--models-max", "2"])  # the gateway loads no weights


def test_a_worker_given_m_and_models_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    argv = ["worker", "--broker", "amqp://x@127.0.0.1/", "-m", str(model), "--models-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "not both" in capsys.readouterr().err
