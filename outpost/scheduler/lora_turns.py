"""Which LoRA settings a step decodes: one per step, the groups of running requests taking turns.

llama.cpp applies adapters to the whole context (`llama_set_adapters_lora`), not per sequence, so
one decode serves requests with one set of (adapter, scale) only, as llama-server batches. Requests
with equal settings decode together; when running requests hold several settings, each step
serves one group, and the group that has waited longest since its last step goes first (a group
never served yet before any, oldest request first among those). A group with work therefore gets
a step within G steps, G the number of groups running (at most the number of slots). The usual
case, every request under the same settings (none at all included), costs one set comprehension.
"""

from __future__ import annotations

from collections.abc import Sequence

from outpost.messages import LoraScales
from outpost.scheduler.request import RequestState


class LoraTurns:
    """The step each group of settings was last served in; see the module docstring."""

    def __init__(self) -> None:
        self._step = 0
        self._last: dict[LoraScales, int] = {}  # settings -> step of its last turn

    def order(self, running: Sequence[RequestState]) -> list[LoraScales]:
        """The settings of `running` (admission order), in the order they should try this step."""
        groups = list(dict.fromkeys(s.lora for s in running))
        if len(groups) <= 1:
            return groups or [()]
        # Forget groups that left, so the table stays as small as what runs.
        self._last = {g: self._last[g] for g in groups if g in self._last}
        first_seen = {g: i for i, g in enumerate(groups)}  # admission order: the oldest request's first
        return sorted(groups, key=lambda g: (self._last.get(g, -1), first_seen[g]))

    def served(self, lora: LoraScales) -> None:
        """`lora`'s group had this step."""
        self._step += 1
        self._last[lora] = self._step
