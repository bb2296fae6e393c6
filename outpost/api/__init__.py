"""Outpost's HTTP API: OpenAI-compatible and SageMaker routes over `InferenceBackend`s.

`create_app` builds the FastAPI app over backends (outpost/backend.py's protocol: a local engine for
`outpost serve`, remote ones for a gateway) and `HttpSettings` (outpost/settings); `api.server` runs
it under uvicorn with a graceful drain. This package translates HTTP JSON to `GenerateRequest` and
`TokenEvent` to JSON/SSE; it imports neither the engine nor a backend's implementation: the commands'
composition roots (outpost/commands) build those.
"""

from outpost.api.app import create_app

__all__ = ["create_app"]
