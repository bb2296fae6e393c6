import sys, time, asyncio
sys.path.insert(0,'/work/main')
from outpost.engine.config import EngineConfig
from outpost.serving.assembly import Engine
from outpost.messages import GenerateRequest
from benchmarks.engine.main import outpost_parallel, make_prompt, GREEDY
M='/root/.cache/outpost/bench/smollm2-135m-q4_0.gguf'
cfg = EngineConfig(model_path=M, n_ctx=8192, n_batch=512, n_seq_max=8, n_threads=2, flash_attn='off', kv_unified='off')

def async_parallel(engine, depth, n, k):
    arrivals = [[] for _ in range(k)]
    async def one(i):
        req = GenerateRequest(make_prompt(engine, depth, salt=100 + i), max_tokens=n, sampling=GREEDY)
        async for ev in engine.client.open(req):
            arrivals[i].extend([time.perf_counter()] * len(ev.token_ids))
    async def main():
        await asyncio.gather(*(one(i) for i in range(k)))
    asyncio.run(main())
    start = max(t[0] for t in arrivals); end = min(t[-1] for t in arrivals)
    produced = sum(1 for ts in arrivals for t in ts if start < t <= end)
    return produced / (end - start)

with Engine(cfg, prefix_cache=False) as e:
    outpost_parallel(e, 128, 64, 8)
    for r in range(4):
        a = [round(outpost_parallel(e, 128, 64, 8),1) for _ in range(2)]
        b = [round(async_parallel(e, 128, 64, 8),1) for _ in range(2)]
        print('threads', a, 'async', b, flush=True)
