"""The engine benchmark (run as `python -m benchmarks.engine`): Outpost's engine against
llama-cpp-python and llama.cpp's llama-batched-bench in one process tree (main)."""
