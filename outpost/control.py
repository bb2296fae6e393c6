"""`outpost ps` and `outpost stop MODEL`: Ollama's two commands for a running server, over its HTTP
API (GET /models and Ollama's /api/ps; llama-server's POST /models/unload). They load no model and
never import llama.cpp.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"


def add_control_parsers(sub: Any) -> None:
    url_help = f"the server (default $OUTPOST_URL or {DEFAULT_URL})"
    ps = sub.add_parser("ps", help="the models a running server serves, and which are loaded")
    ps.add_argument("--url", default=os.environ.get("OUTPOST_URL", DEFAULT_URL), help=url_help)
    ps.add_argument("--api-key", default=os.environ.get("OUTPOST_API_KEY"), help="its API key, if any")
    ps.set_defaults(handler=_cmd_ps)
    stop = sub.add_parser("stop", help="unload a model from a running server (it loads again on demand)")
    stop.add_argument("model")
    stop.add_argument("--url", default=os.environ.get("OUTPOST_URL", DEFAULT_URL), help=url_help)
    stop.add_argument("--api-key", default=os.environ.get("OUTPOST_API_KEY"), help="its API key, if any")
    stop.set_defaults(handler=_cmd_stop)


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=60)


def _error(r: httpx.Response) -> str:
    try:
        err = r.json().get("error")
    except ValueError:
        return r.text.strip() or f"HTTP {r.status_code}"
    return str(err.get("message") if isinstance(err, dict) else err)


def _cmd_ps(args: argparse.Namespace) -> int:
    with _client(args) as http:
        models = http.get("/models")
        loaded = http.get("/api/ps")
    if models.status_code != 200 or loaded.status_code != 200:
        raise RuntimeError(f"{args.url}: {_error(models if models.status_code != 200 else loaded)}")
    until = {m["name"]: m.get("expires_at", "") for m in loaded.json()["models"]}
    rows = [("NAME", "STATUS", "UNLOADS")]
    for card in models.json()["data"]:
        status = (card.get("status") or {}).get("value", "loaded")  # one -m: always loaded
        when = until.get(card["id"], "") if status == "loaded" else ""
        rows.append((card["id"], status, "never" if when.startswith("9999") else when))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    with _client(args) as http:
        r = http.post("/models/unload", json={"model": args.model})
    if r.status_code != 200:
        raise RuntimeError(f"outpost stop {args.model}: {_error(r)}")
    print(f"unloaded {args.model}")
    return 0
