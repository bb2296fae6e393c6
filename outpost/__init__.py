"""Outpost: small language models on your own hardware (llama.cpp kernels, continuous batching)."""

__version__ = "0.1.0"
