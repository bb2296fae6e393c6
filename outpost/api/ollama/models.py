"""Ollama's model routes: /api/version, /api/tags, /api/ps, /api/show, /api/embed, /api/embeddings,
/api/pull and /api/delete.

/api/tags lists the models served and those in the model store (outpost/models/store.py); /api/ps
the models loaded now, each with when it unloads if idle (keepalive.py). /api/pull runs `outpost
pull` in a thread and streams Ollama's progress objects; /api/delete removes a stored model that is
not being served. A name not served and not stored is a 404 `model 'x' not found`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import outpost
from outpost.api.errors import ApiError
from outpost.api.ollama.translate import bad, error_response, guarded
from outpost.api.pipeline.embed import embed
from outpost.api.state import ServerState, state_of
from outpost.backend import InferenceBackend, ManagedBackend
from outpost.models.store import Manifest, ModelStore

router = APIRouter()
NEVER = "9999-12-31T23:59:59Z"  # a model no timer unloads
POLL_S = 0.25  # how often /api/pull reports the download's progress


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise bad(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    return body


def _name(body: dict[str, Any]) -> str:
    name = body.get("model") or body.get("name")  # older clients send `name`
    if not isinstance(name, str) or not name:
        raise bad("model is required")
    return name


def _bare(name: str) -> str:
    return name.removesuffix(":latest")


def served(state: ServerState, name: str) -> tuple[str, InferenceBackend] | None:
    for model_id, backend in state.backends.items():
        if model_id in (name, _bare(name)):
            return model_id, backend
    return None


def _stored(name: str) -> Manifest | None:
    try:
        return ModelStore().resolve(_bare(name))
    except ValueError:
        return None


def _details(family: str, families: list[str] | None, n_params: int, quant: str) -> dict[str, Any]:
    size = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": families,
        "parameter_size": size,
        "quantization_level": quant,
    }


def _served_entry(model_id: str, backend: InferenceBackend) -> dict[str, Any]:
    facts = backend.describe()
    arch = str(facts.get("architecture") or "")
    path = facts.get("model_path")
    size = int(facts.get("size_bytes") or (Path(path).stat().st_size if path and Path(path).is_file() else 0))
    details = _details(arch, [arch] if arch else None, int(facts.get("n_params") or 0), "")
    return {"name": model_id, "model": model_id, "size": size, "digest": "", "details": details}


def _stored_entry(m: Manifest) -> dict[str, Any]:
    return {
        "name": m.name,
        "model": m.name,
        "modified_at": m.pulled_at,
        "size": m.size,
        "digest": m.sha256,
        "details": _details(m.architecture, [m.architecture], m.parameters, m.quant.upper()),
    }


@router.get("/api/version", tags=["ollama"])
async def version() -> dict[str, str]:
    """Outpost's own version (not an Ollama version)."""
    return {"version": getattr(outpost, "__version__", "0")}


@router.get("/api/tags", tags=["ollama"])
async def tags(request: Request) -> dict[str, Any]:
    """The models served, then those in the model store."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    served = [{**_served_entry(m, b), "modified_at": started} for m, b in state_of(request).backends.items()]
    names = {e["name"] for e in served}
    stored = await asyncio.to_thread(ModelStore().manifests)
    return {"models": served + [_stored_entry(m) for m in stored if m.name not in names]}


def _expires_at(backend: InferenceBackend) -> str:
    """When the idle model unloads (Ollama's RFC 3339 time); far away where nothing will unload it."""
    left = backend.expires_in() if isinstance(backend, ManagedBackend) else None
    if left is None:
        return NEVER
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + left))


@router.get("/api/ps", tags=["ollama"])
async def ps(request: Request) -> dict[str, Any]:
    """The models loaded now, each with when it unloads if it stays idle."""
    loaded = [
        {**_served_entry(m, b), "expires_at": _expires_at(b), "size_vram": 0, "context_length": b.n_ctx_seq}
        for m, b in state_of(request).backends.items()
        if not isinstance(b, ManagedBackend) or b.status == "loaded"
    ]
    return {"models": loaded}


async def _stored_or_404(name: str) -> Manifest:
    stored = await asyncio.to_thread(_stored, name)
    if stored is None:
        raise ApiError(404, f"model '{name}' not found")
    return stored


@router.post("/api/show", tags=["ollama"])
async def show(request: Request) -> Response:
    """A served or stored model's details, chat template and capabilities."""
    return await guarded(_show(request))


async def _show(request: Request) -> JSONResponse:
    name = _name(await _body(request))
    found = served(state_of(request), name)
    if found is not None:
        return JSONResponse(_show_served(*found))
    stored = await _stored_or_404(name)
    caps = ["completion", "tools"] if stored.chat_template else ["completion"]
    details = _stored_entry(stored)["details"]
    reply = _show_reply(stored.architecture, stored.parameters, stored.context_length, "", details, caps)
    return JSONResponse({**reply, "modified_at": stored.pulled_at})


def _show_served(model_id: str, backend: InferenceBackend) -> dict[str, Any]:
    facts = backend.describe()
    template = backend.codec.chat_template_source or ""
    # /api/embed answers with the served model's file, or --embedding-model's
    caps = ["completion", "tools", "embedding"] if template else ["completion", "embedding"]
    if "<think>" in template or "enable_thinking" in template:
        caps.append("thinking")
    arch = str(facts.get("architecture") or "")
    details = _served_entry(model_id, backend)["details"]
    return _show_reply(arch, facts.get("n_params"), facts.get("n_ctx_train"), template, details, caps)


def _show_reply(
    arch: str, n_params: Any, n_ctx: Any, template: str, details: dict[str, Any], caps: list[str]
) -> dict[str, Any]:
    info = {"general.architecture": arch, "general.parameter_count": n_params}
    if n_ctx:  # the context the model was trained for, where its file says
        info[f"{arch}.context_length"] = n_ctx
    return {
        "modelfile": "",
        "parameters": "",
        "template": template,
        "details": details,
        "model_info": info,
        "capabilities": caps,
    }


@router.post("/api/embed", tags=["ollama"])
async def embed_route(request: Request) -> JSONResponse:
    """Vectors for `input` (a string or a list of strings)."""
    started = time.monotonic_ns()
    model: str | None = None
    try:
        body = await _body(request)
        model = _name(body)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise bad("input: must be a string or a non-empty list of strings")
        _, vectors, n_tokens = await embed(state_of(request), model, list(texts))
    except ApiError as err:
        return error_response(err, model)
    reply = {"model": model, "embeddings": vectors, "total_duration": time.monotonic_ns() - started}
    return JSONResponse(reply | {"load_duration": 0, "prompt_eval_count": n_tokens})


@router.post("/api/embeddings", tags=["ollama"])
async def embeddings(request: Request) -> JSONResponse:
    """Ollama's older route: one vector for `prompt`."""
    model: str | None = None
    try:
        body = await _body(request)
        model = _name(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad("prompt: must be a string")
        _, vectors, _ = await embed(state_of(request), model, [prompt], param="prompt")
    except ApiError as err:
        return error_response(err, model)
    return JSONResponse({"embedding": vectors[0]})


@router.delete("/api/delete", tags=["ollama"])
async def delete(request: Request) -> Response:
    """Remove a stored model; the one being served is refused (it stays served until restarted)."""
    return await guarded(_delete(request))


async def _delete(request: Request) -> JSONResponse:
    name = _name(await _body(request))
    stored = await _stored_or_404(name)
    store = ModelStore()
    in_use = {str(b.describe().get("model_path") or "") for b in state_of(request).backends.values()}
    if str(store.path_of(stored)) in in_use:
        raise bad(f"model '{name}' is being served; stop the server before deleting it")
    await asyncio.to_thread(store.remove, stored)
    return JSONResponse({})


@router.post("/api/pull", tags=["ollama"])
async def pull(request: Request) -> Any:
    """`outpost pull` of `model`: progress objects as NDJSON, or only the last with `"stream": false`."""
    try:
        body = await _body(request)
        name = _name(body)
    except ApiError as err:
        return error_response(err)
    status = [200]  # what a reply that is not streamed says: a bad name 400, a failed download 500
    lines = _pull_progress(_bare(name), status)
    if body.get("stream", True) is not False:
        return StreamingResponse(_ndjson(lines), media_type="application/x-ndjson")
    last: dict[str, Any] = {}
    async for obj in lines:
        last = obj
    return JSONResponse(last, status_code=status[0])


async def _ndjson(objs: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for obj in objs:
        yield json.dumps(obj).encode() + b"\n"


def _partial_bytes(store: ModelStore) -> tuple[str, int] | None:
    """The newest partial download's (name, bytes so far), or None. A part the pull renames into
    place (done) between the listing and its stat is skipped, not an error mid-stream."""
    sizes: list[tuple[float, str, int]] = []
    for part in store.partial_dir.glob("*.part"):  # none when the directory does not exist
        with contextlib.suppress(FileNotFoundError):
            st = part.stat()
            sizes.append((st.st_mtime, part.stem, st.st_size))
    if not sizes:
        return None
    _, stem, size = max(sizes)
    return stem, size


async def _pull_progress(name: str, status: list[int]) -> AsyncIterator[dict[str, Any]]:
    """Ollama's progress objects; a client that leaves does not stop the download (a thread), which
    the next pull of the same file then finds done, or waits for."""
    from outpost.models.pull import pull as pull_model

    store = ModelStore()
    yield {"status": "pulling manifest"}
    task = asyncio.ensure_future(asyncio.to_thread(pull_model, name, store))
    while not task.done():
        await asyncio.wait({task}, timeout=POLL_S)
        seen = _partial_bytes(store)
        if seen is not None and not task.done():
            yield {"status": "downloading", "digest": f"sha256:{seen[0]}", "completed": seen[1]}
    try:
        manifest = task.result()
    except Exception as exc:  # the hub's or index's own words: no such model, unreachable, ...
        status[0] = 400 if isinstance(exc, ValueError) else 500
        yield {"error": f"pull model '{name}': {exc}"}
        return
    digest = f"sha256:{manifest.sha256}"
    yield {"status": "downloading", "digest": digest, "total": manifest.size, "completed": manifest.size}
    yield {"status": f"verifying {manifest.verified} digest"}
    yield {"status": "writing manifest"}
    yield {"status": "success"}
