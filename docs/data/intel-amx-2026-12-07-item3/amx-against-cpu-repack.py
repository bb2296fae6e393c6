import sys, statistics
sys.path.insert(0, '/work/main')
import outpost.engine.cpu_probe as cp
from outpost.engine.config import EngineConfig
from outpost.serving.assembly import Engine
from benchmarks.engine.main import outpost_parallel, outpost_decode, make_prompt
M='/root/.cache/outpost/bench/smollm2-135m-q4_0.gguf'
real = cp.amx_tiles_work
for r in range(3):
    for mode in ('amx', 'noamx'):
        cp.amx_tiles_work = real if mode == 'amx' else (lambda: False)
        cfg = EngineConfig(model_path=M, n_ctx=8192, n_batch=512, n_seq_max=8, n_threads=2, flash_attn='off', kv_unified='off')
        with Engine(cfg, prefix_cache=False) as e:
            rates = [outpost_parallel(e, 128, 64, 8) for _ in range(2)]
        print(r, mode, cfg.weight_layout, [round(x,1) for x in rates], flush=True)
