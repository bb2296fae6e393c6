"""LoRA adapters as llama-server's users drive them (issue 45): `outpost serve --lora / --lora-scaled
/ --lora-init-without-apply`, raw HTTP to `/lora-adapters` and a `/completion` with `lora`.

The adapters (`outpost models synth --lora`) change the tiny model's output projection, so the
first token's distribution (`n_probs`) shows which settings a request decoded under; two requests
under the same settings get the same distribution. Nothing here waits on the engine's speed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import OUTPOST, start

from outpost.models.lora import write_lora_adapter

FLAGS = ("-np", "2", "-c", "512", "--temp", "0")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("lora")
    return write_lora_adapter("tiny", folder / "a.gguf", seed=1), write_lora_adapter(
        "tiny", folder / "b.gguf", seed=2
    )


@pytest.fixture(scope="module")
def http(tiny_model: Path, adapters: tuple[Path, Path]) -> Iterator[httpx.Client]:
    a, b = adapters
    with (
        start(tiny_model, *FLAGS, "--lora", str(a), "--lora-scaled", str(b), "0.5") as srv,
        srv.client() as c,
    ):
        yield c


def _first_probs(http: httpx.Client, **body: Any) -> dict[int, float]:
    """The first generated token's top-10 logprobs, by token id."""
    r = http.post("/completion", json={"prompt": "The sky is", "n_predict": 1, "n_probs": 10, **body})
    assert r.status_code == 200, r.text
    return {e["id"]: e["logprob"] for e in r.json()["completion_probabilities"][0]["top_logprobs"]}


def _same(p: dict[int, float], q: dict[int, float]) -> bool:
    """Equal but for float rounding (a prompt read whole or after a cached prefix sums differently)."""
    return p.keys() == q.keys() and all(abs(p[t] - q[t]) < 0.05 for t in p)


def _differs(p: dict[int, float], q: dict[int, float]) -> bool:
    """Another distribution: other top tokens, or a logprob a whole unit away."""
    return p.keys() != q.keys() or any(abs(p[t] - q[t]) > 1.0 for t in p)


def test_get_lists_the_adapters_with_their_flag_scales(
    http: httpx.Client, adapters: tuple[Path, Path]
) -> None:
    listed = http.get("/lora-adapters").json()
    assert [(e["id"], e["path"], e["scale"]) for e in listed] == [
        (0, str(adapters[0]), 1.0),
        (1, str(adapters[1]), 0.5),
    ]


def test_a_request_lora_list_and_the_posted_defaults_change_the_distribution(http: httpx.Client) -> None:
    base = _first_probs(http, lora=[{"id": 0, "scale": 0}])  # adapters not named: 0 too
    only_a = _first_probs(http, lora=[{"id": 0, "scale": 1.0}])
    both = _first_probs(http)  # no lora: the flags' scales
    assert _differs(base, only_a) and _differs(only_a, both) and _differs(base, both)
    assert _same(_first_probs(http, lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]), both)
    try:
        assert http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).json() == {"success": True}
        assert [e["scale"] for e in http.get("/lora-adapters").json()] == [1.0, 0.0]
        assert _same(_first_probs(http), only_a)
        assert http.post("/lora-adapters", json=[]).status_code == 200
        assert _same(_first_probs(http), base)
    finally:
        http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_requests_under_different_settings_at_once_each_get_their_own(http: httpx.Client) -> None:
    """Two slots, two settings: they take turns by step, and each decodes under its own."""
    import concurrent.futures

    alone = {s: _first_probs(http, lora=[{"id": 0, "scale": s}]) for s in (0.0, 1.0)}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [(s, pool.submit(_first_probs, http, lora=[{"id": 0, "scale": s}])) for s in (0.0, 1.0) * 2]
        for s, job in jobs:
            assert _same(job.result(), alone[s])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", {"prompt": "hi", "n_predict": 1, "lora": [{"id": 7, "scale": 1.0}]}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "lora": [{"id": 2, "scale": 1}]},
        ),
        ("/completion", {"prompt": "hi", "n_predict": 1, "lora": [{"id": 0, "scale": "x"}]}),
        ("/lora-adapters", [{"id": 9, "scale": 1.0}]),
    ],
)
def test_an_unknown_id_or_a_bad_scale_is_a_400_naming_lora(http: httpx.Client, path: str, body: Any) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("lora")


def test_init_without_apply_loads_them_at_scale_zero(tiny_model: Path, adapters: tuple[Path, Path]) -> None:
    with (
        start(tiny_model, *FLAGS, "--lora", str(adapters[0]), "--lora-init-without-apply") as srv,
        srv.client() as c,
    ):
        assert [e["scale"] for e in c.get("/lora-adapters").json()] == [0.0]
        assert _same(_first_probs(c), _first_probs(c, lora=[{"id": 0, "scale": 0.0}]))
        assert _differs(_first_probs(c), _first_probs(c, lora=[{"id": 0, "scale": 1.0}]))


def test_a_file_that_is_not_an_adapter_is_a_one_line_start_up_error(tiny_model: Path) -> None:
    cmd = [*OUTPOST, "serve", "-m", str(tiny_model), "--lora", str(tiny_model)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "is not a LoRA adapter GGUF" in lines[-1]
