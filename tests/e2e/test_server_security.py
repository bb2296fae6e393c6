"""API keys, TLS with a self-signed certificate, CORS, prompt logging and the request timeout."""

from __future__ import annotations

import datetime
import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from server_harness import Server, assert_openai_error, paced, sse_events, start

KEY_FLAG = "sk-flag-0123456789"
KEY_FILE = "sk-file-abcdefghij"
ORIGIN = "https://app.example.com"
SECRET_PROMPT = "the launch code is 0000"
# Every step takes >= 5 ms, so 1,900 tokens take >= 9.5 s: past the 3 s request timeout on any machine.
STEP_MS, TIMEOUT_S, LONG_TOKENS = 5, 3, 1900
assert LONG_TOKENS * STEP_MS / 1000 > 3 * TIMEOUT_S


def self_signed(directory: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("tls")
    key, cert = self_signed(d)
    keys = d / "keys.txt"
    keys.write_text(f"# team keys\n{KEY_FILE}\n\n")
    # 2,048 positions per request whatever the KV layout: a stream per slot on most CPUs, one shared
    # pool where AMX's one-token kernel serves 1-2 slots
    args = ("-np", "2", "-c", "4096", "--api-key", KEY_FLAG, "--api-key-file", str(keys))
    args += ("--ssl-keyfile", key, "--ssl-certfile", cert, "--cors-origins", ORIGIN)
    args += ("--request-timeout", str(TIMEOUT_S), "--log-prompts")
    with start(tiny_model, *args, tls_ca=cert, env=paced(STEP_MS)) as srv:
        yield srv


CHAT = {"messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 4}


def test_missing_and_wrong_keys_are_401(server: Server) -> None:
    with server.client() as c:
        assert_openai_error(c.post("/v1/chat/completions", json=CHAT), 401, "invalid_api_key")
        wrong = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-nope"})
        assert_openai_error(wrong, 401, "invalid_api_key")
        assert_openai_error(c.get("/v1/models", headers={"x-api-key": "sk-nope"}), 401)
        assert_openai_error(c.post("/invocations", json={"inputs": "x"}), 401)


def test_good_keys_pass_as_bearer_or_x_api_key(server: Server) -> None:
    with server.client() as c:
        assert (
            c.post(
                "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY_FLAG}"}
            ).status_code
            == 200
        )
        assert c.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY_FILE}).status_code == 200


def test_health_ping_metrics_stay_open(server: Server) -> None:
    with server.client() as c:
        for path in ("/health", "/ping", "/metrics"):
            assert c.get(path).status_code == 200, path


def test_openai_client_over_tls(server: Server) -> None:
    with httpx.Client(verify=server.verify) as http:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY_FLAG, http_client=http, max_retries=0)
        r = client.chat.completions.create(
            model="tiny-f16", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert r.choices[0].message.content is not None
    with pytest.raises(httpx.ConnectError):  # the certificate is not trusted by default
        httpx.get(f"{server.url}/health")


def test_cors_preflight_and_headers(server: Server) -> None:
    with server.client() as c:
        pre = c.options(
            "/v1/chat/completions",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
        r = c.get("/health", headers={"Origin": ORIGIN})
        assert r.headers["access-control-allow-origin"] == ORIGIN
        other = c.get("/health", headers={"Origin": "https://evil.example.com"})
        assert "access-control-allow-origin" not in other.headers


def test_request_timeout_is_504_or_a_stream_error(server: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY_FLAG}"}
    long = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": LONG_TOKENS, "ignore_eos": True}
    with server.client(timeout=60) as c:
        r = c.post("/v1/chat/completions", json=long, headers=auth)
        err = assert_openai_error(r, 504, "timeout")
        assert err["type"] == "timeout"
        with c.stream("POST", "/v1/chat/completions", json={**long, "stream": True}, headers=auth) as s:
            assert s.status_code == 200
            events = sse_events(list(s.iter_lines()))
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "timeout" and set(events[-2]["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    server.wait_idle(10.0)


def test_log_has_prompts_when_asked_and_never_keys(server: Server) -> None:
    log = server.stderr()
    assert KEY_FLAG not in log and KEY_FILE not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(e.get("prompt") and SECRET_PROMPT in e["prompt"] and "completion" in e for e in lines)
    assert any(e["status"] == 401 for e in lines)
