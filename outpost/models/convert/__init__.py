"""Hugging Face -> GGUF conversion, Outpost's own, on the `gguf` package (not llama.cpp's script).

`convert_model(src, out, outtype)` converts a local HF folder or a repo id (downloaded first) of a
supported architecture (`ARCHITECTURES`) to f32, f16, bf16 or q8_0 (`OUTTYPES`), streaming one
tensor block at a time. Modules: source (folder or download), hparams (config.json), archs
(per-architecture rules and metadata), st_reader (safetensors), tensors (names, transforms,
encoding), vocab / vocab_bpe / vocab_spm / pretokenizer (tokenizer), converter (the file), cli_args.
"""

from outpost.models.convert.archs import ARCHITECTURES
from outpost.models.convert.converter import convert_model
from outpost.models.convert.tensors import OUTTYPES

__all__ = ["ARCHITECTURES", "OUTTYPES", "convert_model"]
