"""Where a conversion reads from: a local Hugging Face model directory, or a repo id to download first.

Owns telling the two apart and the download: only what conversion reads (config, tokenizer files,
the HF-format safetensors shards; never Mistral's duplicate consolidated.safetensors or PyTorch
.bin files), through huggingface_hub's resumable snapshot_download into its usual cache, with
HF_ENDPOINT and HF_TOKEN honoured. Hub answers that mean bad input (no such repo, gated, no such
revision) become ValueError (exit 2); network failures stay runtime errors (exit 1).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What conversion reads. Shards of HF-format checkpoints are always named model*.safetensors.
DOWNLOAD_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
    "model*.safetensors",
]
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_repo_id(src: str) -> bool:
    """owner/name, as Hugging Face spells repo ids (and no such local path exists)."""
    return bool(_REPO_ID.fullmatch(src)) and ".." not in src and not Path(src).exists()


def download(repo_id: str) -> Path:
    """Fetch the files conversion needs into the Hugging Face cache and return the snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=DOWNLOAD_PATTERNS,
            endpoint=os.environ.get("HF_ENDPOINT") or None,  # read now, not at huggingface_hub's import
            token=os.environ.get("HF_TOKEN") or None,
        )
    except GatedRepoError:
        raise ValueError(f"{repo_id} is gated: accept its license on Hugging Face and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"no model repo {repo_id} on Hugging Face (or it is private: set HF_TOKEN)"
        ) from None
    except (RevisionNotFoundError, HFValidationError) as exc:
        raise ValueError(f"cannot download {repo_id}: {exc}") from None
    return Path(str(folder))


def resolve_source(src: str) -> tuple[Path, str | None]:
    """(model directory, repo id or None) for a CLI SRC argument."""
    path = Path(src).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{src} is not a directory: give a Hugging Face model folder or a repo id")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {src}: not a Hugging Face model folder")
        return path, None
    if is_repo_id(src):
        return download(src), src
    raise FileNotFoundError(f"no such directory: {src} (a Hugging Face repo id looks like owner/name)")
