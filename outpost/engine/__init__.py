"""The only package that imports `llama_cpp`: model loading, vocab, chat templates, sampling, decode.

Submodules are imported directly (`outpost.engine.model`, ...) so that importing `outpost.engine`
itself stays cheap for code that only needs the config.
"""
