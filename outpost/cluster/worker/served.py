"""One model a worker serves: its backend, its slots, its lane, its intake and its heartbeat.

A worker serves one model (`-m`) or several (`--models-dir`, or the store's models: each one a model
pool's `PooledModel`, loaded by its first request, unloaded when idle or for room, as `outpost serve`
does: outpost/serving/model_pool.py). Each model keeps what one model's worker had: its shared queue
and lane, one credit per slot of that model's engine (its sizing plan's slots, known before it
loads), the requests it runs (`BackendRequests`), the prefixes its KV holds and its prefill speed,
and its own heartbeat, which also names every model of the worker and says whether this one is
loaded (heartbeat.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outpost.backend import InferenceBackend, ManagedBackend
from outpost.cluster.broker import topology
from outpost.cluster.heartbeat import Heartbeat, template_hash
from outpost.cluster.prefix import BLOCK, PrefixIndex
from outpost.cluster.worker.intake import Intake
from outpost.cluster.worker.requests import BackendRequests
from outpost.messages import TokenEvent


@dataclass(eq=False)
class ServedModel:
    """One model of a worker. `slots`: its engine's (for a model not loaded yet, its plan's)."""

    name: str
    backend: InferenceBackend
    slots: int
    lane: str = ""  # set by `Worker` (it names the lane after itself)
    prefill_tps: float = 0.0  # recent prompt tokens per second (an average of finished requests)
    intake: Intake | None = None  # on the current connection
    requests: BackendRequests | None = None  # set by `Worker`
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)

    @classmethod
    def of(cls, name: str, backend: InferenceBackend) -> ServedModel:
        """A model whose backend is running: its slots are the backend's."""
        return cls(name, backend, backend.stats().slots_total)

    def named_for(self, worker_id: str) -> None:
        self.lane = topology.lane_queue(self.name, worker_id)

    @property
    def in_flight(self) -> int:
        return len(self.intake.tasks) if self.intake is not None else 0

    @property
    def loaded(self) -> bool:
        backend = self.backend
        return not isinstance(backend, ManagedBackend) or backend.status == "loaded"

    def heartbeat(self, worker_id: str, draining: bool, completed: int, models: tuple[str, ...]) -> Heartbeat:
        """This model's heartbeat (a model not loaded: no KV, so no prefixes and 0 cells)."""
        backend = self.backend
        kv_cells = backend.stats().kv_cells_total
        return Heartbeat(
            worker_id,
            self.name,
            self.slots,
            self.in_flight,
            draining,
            completed,
            self.lane,
            tuple(self.prefixes.hashes(backend.cached_sequences())),
            self.prefill_tps,
            kv_cells // BLOCK,
            backend.n_ctx_seq,
            kv_cells,
            template_hash(backend.codec.chat_template_source),
            models,
            self.loaded,
        )

    def note_prefill(self, final: TokenEvent) -> None:
        """Keeps a running average of prompt tokens/s: gateways size their spill windows with it."""
        t = final.timings
        if t is None or t.prompt_n < 16 or t.prompt_ms <= 0:
            return
        tps = t.prompt_n / t.prompt_ms * 1000.0
        self.prefill_tps = tps if self.prefill_tps == 0 else 0.8 * self.prefill_tps + 0.2 * tps
