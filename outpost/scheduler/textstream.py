"""Incremental detokenization: token pieces (bytes) in, text that is safe to show out.

Two things are held back between tokens:
- an incomplete UTF-8 sequence (a character split over several tokens), so no half character is
  ever shown; invalid bytes become U+FFFD;
- the longest end of the pending text that could still grow into a stop string, so a partial match
  is never shown and then retracted.
When a stop string appears in the text not yet shown (even split over several tokens), the text
before it is released, the rest is dropped and the stream reports the stop. `prime()` restores
that hold-back state from output already delivered elsewhere (a request resumed on another worker).
"""

from __future__ import annotations

import codecs


class TextStream:
    """One request's detokenizer; `feed()` per token, `finish()` once at the end."""

    __slots__ = ("_decoder", "_held", "_max_hold", "_prefixes", "_stopped", "_stops")

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)  # an empty stop string would match at once
        # Every proper prefix of every stop string: the tails of text that must wait.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """A stop string was found; further input is ignored."""
        return self._stopped

    @property
    def held(self) -> str:
        """Decoded text kept back because it may be the start of a stop string."""
        return self._held

    def feed(self, piece: bytes) -> tuple[str, bool]:
        """Adds one token's bytes; returns (text now safe to show, whether a stop string ended it)."""
        if self._stopped:
            return "", True
        return self._release(self._held + self._decoder.decode(piece))

    def prime(self, shown: bytes) -> None:
        """Takes in output the reader already has (a resumed request's earlier tokens) without
        showing it again: only what was held back carries over (the start of a stop string, an
        incomplete UTF-8 character), so the stream continues exactly as an uninterrupted one.

        One call with the tokens' pieces joined is the same as feeding them one by one: the held
        tail is the longest end of all the text so far that may start a stop string."""
        self.feed(shown)

    def finish(self) -> str:
        """Flushes everything held back (a dangling partial character becomes U+FFFD)."""
        if self._stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        cut = self._find_stop(text)
        if cut >= 0:
            self._stopped = True
            return text[:cut]
        return text

    def _release(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        cut = self._find_stop(text)
        if cut >= 0:
            self._stopped = True
            self._held = ""
            return text[:cut], True
        keep = self._partial_match_len(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def _find_stop(self, text: str) -> int:
        """Index of the earliest stop string in `text`, or -1. `text` is short: at most the held
        tail (shorter than the longest stop) plus one token's text."""
        best = -1
        for stop in self._stops:
            i = text.find(stop)
            if i >= 0 and (best < 0 or i < best):
                best = i
        return best

    def _partial_match_len(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of some stop string."""
        for k in range(min(len(text), self._max_hold), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0
