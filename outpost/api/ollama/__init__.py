"""Ollama's API (/api/chat, /api/generate, /api/tags, ...) over the shared pipeline; see docs/ollama.md."""
