"""llama-server's slot actions on a local engine: save a slot's KV to a file, restore it, erase it.

The files live in one folder (`--slot-save-path`); a name is a bare file name (the API refuses
paths, as llama-server's `fs_validate_filename`). Save and restore run on the engine thread between
two steps: they read and write the llama context, which only that thread drives. Each first
applies the memory ops the scheduler decided since the last step, so the sequence holds exactly
what the scheduler's slot says; the scheduler is read and changed under the core's lock.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from outpost.messages import SlotAction, SlotActionError, SlotResult

if TYPE_CHECKING:
    from outpost.scheduler import Scheduler
    from outpost.serving.assembly import Engine


class SlotFiles:
    """Slot actions for one engine, with files in `folder` (None: slot actions are off)."""

    def __init__(self, engine: Engine, folder: str | None) -> None:
        self.engine = engine
        self.folder = Path(folder) if folder else None
        if self.folder is not None:  # llama-server creates it (with its parents) at start
            self.folder.mkdir(parents=True, exist_ok=True)

    async def run(self, action: SlotAction) -> SlotResult:
        if self.folder is None:
            raise SlotActionError(
                "This server does not support slots action. Start it with `--slot-save-path`", "disabled"
            )
        core = self.engine.core
        if action.action == "erase":
            return SlotResult(core.with_scheduler(lambda s: s.erase_slot(action.id_slot)))
        path = self.folder / action.filename
        if path.parent != self.folder:  # the API checked the name; never write outside the folder
            raise SlotActionError(f"Invalid filename {action.filename!r}", "file")
        if action.action == "restore" and not path.is_file():
            raise SlotActionError(f"Unable to restore slot: no slot file named {action.filename!r}", "file")
        job = self._save if action.action == "save" else self._restore
        return await asyncio.wrap_future(core.run_on_engine_thread(lambda: job(action.id_slot, path)))

    def _flush(self) -> None:
        """Applies the memory ops decided since the last step (engine thread)."""
        ops = self.engine.core.with_scheduler(lambda s: s.take_memory_ops())
        self.engine.runner.apply_memory_ops(ops)

    def _save(self, seq_id: int, path: Path) -> SlotResult:
        from outpost.engine.slot_state import save_sequence

        started = time.perf_counter()
        tokens = self.engine.core.with_scheduler(lambda s: list(s.idle_slot(seq_id).cached))
        self._flush()
        try:
            written = save_sequence(self.engine.model, seq_id, tokens, path)
        except OSError as exc:
            raise SlotActionError(f"Unable to save slot: {exc}", "file") from exc
        return SlotResult(len(tokens), written, (time.perf_counter() - started) * 1e3)

    def _restore(self, seq_id: int, path: Path) -> SlotResult:
        from outpost.engine.slot_state import clear_sequence, load_sequence, token_count

        started = time.perf_counter()
        core, model = self.engine.core, self.engine.model
        core.with_scheduler(lambda s: s.idle_slot(seq_id))
        n = token_count(model, path)
        if n is None:
            raise SlotActionError(f"Unable to restore slot: {path.name} is not a slot file", "file")
        if n > self.engine.n_ctx_seq:
            raise SlotActionError(
                f"Unable to restore slot: its {n} tokens do not fit a slot ({self.engine.n_ctx_seq})", "file"
            )

        def clear(s: Scheduler) -> None:
            s.clear_for_restore(seq_id, n)

        core.with_scheduler(clear)
        self._flush()
        tokens, read = load_sequence(model, seq_id, path, n)
        if read == 0 or any(not 0 <= t < model.vocab.n_tokens for t in tokens):
            clear_sequence(model, seq_id)
            raise SlotActionError(
                "Unable to restore slot: no room in the KV cache, or the file is not a slot of this model",
                "file",
            )
        core.with_scheduler(lambda s: s.restored(seq_id, tokens))
        return SlotResult(len(tokens), read, (time.perf_counter() - started) * 1e3)
