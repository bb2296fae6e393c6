"""The engine benchmark (run as `python benchmarks/engine.py`): Outpost's engine against
llama-cpp-python and llama.cpp's llama-batched-bench in one process tree (main)."""
