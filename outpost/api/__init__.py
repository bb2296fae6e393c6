"""Outpost's HTTP API: OpenAI-compatible and SageMaker routes over an `EngineClient`.

`create_app` builds the FastAPI app; `serve` runs it with uvicorn (the `outpost serve` command).
This package translates HTTP JSON to `GenerateRequest` and `TokenEvent` to JSON/SSE; it never
touches llama.cpp.
"""

from outpost.api.app import create_app
from outpost.api.config import ServerConfig
from outpost.api.server import serve

__all__ = ["ServerConfig", "create_app", "serve"]
