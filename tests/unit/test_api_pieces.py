"""The HTTP layer's pure pieces, with no model: token budgets, keys, body limit, TGI sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from outpost.api.auth import ApiKeyMiddleware, key_matches, presented_key
from outpost.api.errors import ApiError, install_error_handlers
from outpost.api.limits import BodyLimitMiddleware
from outpost.api.pipeline.mapping import check_n, resolve_max_tokens, stop_strings
from outpost.api.pipeline.schemas import ChatCompletionRequest, TgiParameters
from outpost.api.sagemaker.routes import tgi_sampling


def test_max_tokens_defaults_clip_and_explicit_overflow_is_400() -> None:
    assert resolve_max_tokens(100, None, 1024, 1024) == 924  # absent: clipped to the room left
    assert resolve_max_tokens(100, None, 4096, 1024) == 1024
    assert resolve_max_tokens(100, -1, 1024, 16) == 924
    assert resolve_max_tokens(100, 900, 1024, 16) == 900
    with pytest.raises(ApiError) as exc:
        resolve_max_tokens(100, 925, 1024, 16)
    assert exc.value.status == 400 and exc.value.code == "context_length_exceeded"
    with pytest.raises(ApiError) as exc:
        resolve_max_tokens(1024, None, 1024, 16)
    assert exc.value.code == "context_length_exceeded"


def test_n_and_stop_checks() -> None:  # an unknown model's 404: test_api_backend_seam.py
    assert (check_n(None), check_n(1), check_n(16)) == (1, 1, 16)
    with pytest.raises(ApiError, match="n=17"):
        check_n(17)
    with pytest.raises(ApiError, match="n=0"):
        check_n(0)
    assert (
        stop_strings("x") == ("x",)
        and stop_strings(["a", "", "b"]) == ("a", "b")
        and stop_strings(None) == ()
    )


def test_keys_from_either_header_compared_against_all() -> None:
    assert presented_key([(b"authorization", b"Bearer abc")]) == b"abc"
    assert presented_key([(b"x-api-key", b"xyz")]) == b"xyz"
    assert presented_key([(b"authorization", b"Basic abc")]) is None
    assert key_matches(b"k2", (b"k1", b"k2")) and not key_matches(b"k3", (b"k1", b"k2"))
    assert not key_matches(None, (b"k1",))


def _app(max_body: int, keys: tuple[str, ...] = ()) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, object]:
        return {"n": len(await request.body()), "type": request.headers["content-type"]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(BodyLimitMiddleware, max_body=max_body)
    app.add_middleware(ApiKeyMiddleware, keys=keys, open_paths=("/health",))
    return app


def test_body_limit_and_json_content_type() -> None:
    with TestClient(_app(2048)) as c:
        ok = c.post(
            "/echo", content=b"{}" * 10, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert ok.json() == {"n": 20, "type": "application/json"}
        big = c.post("/echo", content=b"x" * 4096)
        assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"

        def chunks() -> object:  # no Content-Length: counted while read
            yield b"x" * 1500
            yield b"x" * 1500

        assert c.post("/echo", content=chunks()).status_code == 413  # type: ignore[arg-type]


def test_auth_middleware() -> None:
    with TestClient(_app(2048, keys=("s3cret",))) as c:
        assert c.post("/echo", content=b"{}").status_code == 401
        assert c.post("/echo", content=b"{}", headers={"x-api-key": "s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200


def test_tgi_sampling_is_greedy_unless_asked() -> None:
    assert tgi_sampling(TgiParameters()).temperature == 0.0
    assert tgi_sampling(TgiParameters(temperature=0.7)).temperature == 0.7
    assert tgi_sampling(TgiParameters(do_sample=True)).temperature == 1.0
    assert tgi_sampling(TgiParameters(do_sample=False, temperature=0.7)).temperature == 0.0


def test_chat_body_ignores_unknown_fields_and_reads_text_parts() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "user": "someone",
            "metadata": {"k": "v"},
        }
    )
    assert body.messages[0].text() == "ab"


def test_server_settings_from_options(tmp_path: Path) -> None:
    from outpost.settings import EngineSettings, HttpSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nk-file\n")
    options = {"api_keys": ("k-env1", "k-env2"), "api_key_file": str(keys)}
    cfg = HttpSettings.model_validate(options)
    assert cfg.port == 8080 and cfg.host == "127.0.0.1"
    assert cfg.api_keys == ("k-env1", "k-env2", "k-file") and "k-env1" not in repr(cfg)
    engine = EngineSettings(parallel=8)
    assert engine.parallel == 8 and engine.served_model_id(str(model)) == "m"
    with pytest.raises(ValueError, match="TLS needs both"):
        HttpSettings(ssl_keyfile=str(keys))
