"""The vocab-only prompt codec a gateway loads: same tokens and prompts as the serving engine's."""

from __future__ import annotations

from pathlib import Path

from outpost.engine.codec import load_codec
from outpost.engine.config import EngineConfig
from outpost.engine.model import LoadedModel

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, wörld! 1234"}]


def test_vocab_only_codec_matches_the_loaded_model(tiny_model: Path) -> None:
    vocab_only = load_codec(str(tiny_model))
    try:
        with LoadedModel(EngineConfig(model_path=str(tiny_model), n_ctx=256, n_seq_max=1)) as model:
            full = model.codec
            prompt = full.render_chat(MESSAGES)
            assert vocab_only.codec.render_chat(MESSAGES) == prompt
            tokens = full.tokenize_prompt(prompt)
            assert vocab_only.codec.tokenize_prompt(prompt) == tokens
            assert vocab_only.codec.detokenize(tokens[1:]) == full.detokenize(tokens[1:])
            assert vocab_only.codec.n_vocab == full.n_vocab
            assert vocab_only.describe()["n_ctx_train"] == model.n_ctx_train
    finally:
        vocab_only.close()
