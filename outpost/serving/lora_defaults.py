"""The server-wide LoRA scales and a request's adapter settings resolved against them.

As llama-server: the flags set each adapter's starting scale (`--lora` 1, `--lora-scaled` its own,
`--lora-init-without-apply` 0); `POST /lora-adapters` replaces them (an adapter it does not name
gets 0); a request without `lora` decodes under the scales of the moment it is submitted, one with
`lora` under exactly its list (adapters it does not name: 0). Unlike llama-server, an id that names
no loaded adapter is refused (a 400 naming `lora`) rather than ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

from outpost.messages import LoraAdapter, LoraScales, RequestRejected, lora_settings


class LoraDefaults:
    """The loaded adapters' files and default scales, by id."""

    def __init__(self, adapters: Sequence[tuple[str, float]] = ()) -> None:
        self._paths = [path for path, _ in adapters]
        self._scales = [scale for _, scale in adapters]

    def listing(self) -> list[LoraAdapter]:
        pairs = zip(self._paths, self._scales, strict=True)
        return [LoraAdapter(i, path, scale) for i, (path, scale) in enumerate(pairs)]

    def set_scales(self, scales: LoraScales) -> None:
        """POST /lora-adapters: the new defaults; RequestRejected for an id not loaded."""
        self._check(scales)
        given = dict(scales)
        self._scales = [given.get(i, 0.0) for i in range(len(self._paths))]

    def resolve(self, asked: LoraScales | None) -> LoraScales:
        """A request's settings in normal form: the defaults (None), or its own list, checked."""
        if asked is None:
            return lora_settings(enumerate(self._scales))
        self._check(asked)
        return lora_settings(asked)

    def _check(self, scales: LoraScales) -> None:
        for adapter_id, _ in scales:
            if not 0 <= adapter_id < len(self._paths):
                loaded = f"ids 0 to {len(self._paths) - 1}" if self._paths else "none is loaded (--lora)"
                raise RequestRejected(f"lora: no LoRA adapter has id {adapter_id} ({loaded})", "lora")
