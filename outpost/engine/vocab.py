"""Tokens <-> text through llama.cpp's own vocabulary (so tokenization matches the model exactly)."""

from __future__ import annotations

import ctypes
from typing import Any

from outpost.engine.lib import llama
from outpost.messages import FimTokens


class Vocab:
    """A view of a loaded model's vocabulary; valid while the model lives."""

    def __init__(self, vocab_ptr: Any) -> None:
        self._vocab = vocab_ptr
        self.handle = vocab_ptr  # for llama.cpp calls that need the vocab (grammar samplers)
        self.n_tokens = int(llama.llama_vocab_n_tokens(vocab_ptr))
        self.bos = int(llama.llama_vocab_bos(vocab_ptr))
        self.eos = int(llama.llama_vocab_eos(vocab_ptr))
        self.add_bos = bool(llama.llama_vocab_get_add_bos(vocab_ptr))
        # Every end-of-generation id: ignore_eos bans them all, not just EOS.
        self.eog_ids = frozenset(t for t in range(self.n_tokens) if llama.llama_vocab_is_eog(vocab_ptr, t))
        self.fim = FimTokens(
            pre=int(llama.llama_vocab_fim_pre(vocab_ptr)),
            suf=int(llama.llama_vocab_fim_suf(vocab_ptr)),
            mid=int(llama.llama_vocab_fim_mid(vocab_ptr)),
            rep=int(llama.llama_vocab_fim_rep(vocab_ptr)),
            sep=int(llama.llama_vocab_fim_sep(vocab_ptr)),
        )
        # Filled lazily; safe across threads (the engine and the API both render pieces) because
        # each call uses its own buffer and a dict assignment is atomic under the GIL.
        self._pieces: dict[int, bytes] = {}

    @property
    def bos_text(self) -> str:
        return self.token_to_piece(self.bos, special=True).decode(errors="replace") if self.bos >= 0 else ""

    @property
    def eos_text(self) -> str:
        return self.token_to_piece(self.eos, special=True).decode(errors="replace") if self.eos >= 0 else ""

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> token ids. add_special adds BOS where the model asks for it; parse_special
        turns '<|im_start|>' in rendered chat templates into its control token."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama.llama_token * capacity)()
        n = int(llama.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special))
        if n < 0:  # the buffer was too small: -n is the size needed
            capacity = -n
            buf = (llama.llama_token * capacity)()
            n = int(
                llama.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            )
        if n < 0:
            raise ValueError("text could not be tokenized")
        return list(buf[:n])

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character). Cached for output."""
        if not special:
            cached = self._pieces.get(token)
            if cached is not None:
                return cached
        if not 0 <= token < self.n_tokens:
            raise ValueError(f"token id {token} out of range [0, {self.n_tokens})")
        buf = ctypes.create_string_buffer(64)
        n = int(llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special))
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = int(llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special))
        piece = buf.raw[:n]
        if not special:
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        """Token ids -> text; invalid UTF-8 becomes U+FFFD."""
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")
