"""Configuration by environment: every long flag of the server commands has an `OUTPOST_*` variable.

The name comes from the long flag (`--api-key-file` -> `OUTPOST_API_KEY_FILE`, `--alias` ->
`OUTPOST_ALIAS`, `--no-prefix-cache` -> `OUTPOST_NO_PREFIX_CACHE`). A variable becomes the flag's
default, so a flag on the command line still wins. Lists (repeatable flags) are comma-separated;
switches take 1/true/yes/on or 0/false/no/off; an empty variable is unset. Applied to whichever of
ENV_COMMANDS is being run; the flags themselves are generated from the settings blocks
(outpost/settings), which list each variable in `--help` with `annotate`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PREFIX = "OUTPOST_"
ENV_COMMANDS = ("serve", "gateway", "worker")
MODEL_COMMANDS = frozenset({"run", "serve", "worker"})  # those that load a model: on huge pages
# Names the README documented before the rule above; the flag's own name wins when both are set.
# OUTPOST_BROKER_URL: the workers' and gateways' first variable for --broker.
ALIASES = {
    "OUTPOST_MODEL_PATH": "--model",
    "OUTPOST_API_KEYS": "--api-key",
    "OUTPOST_BROKER_URL": "--broker",
}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand of a command line: its first word that is not an option (the top-level
    parser's only options are flags, so no option value can come first)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def env_name(action: argparse.Action) -> str | None:
    """`OUTPOST_<LONG_FLAG>` for an option with a long flag; None for positionals, --help and such."""
    if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
        return None
    long = next((s for s in action.option_strings if s.startswith("--")), None)
    return None if long is None else PREFIX + long[2:].upper().replace("-", "_")


def _names(action: argparse.Action) -> list[str]:
    own = env_name(action)
    if own is None:
        return []
    return [own, *(alias for alias, flag in ALIASES.items() if flag in action.option_strings)]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name (empty when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _convert_one(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    try:
        value = action.type(raw) if callable(action.type) else raw
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(f"{name}={raw!r} is not a valid {action.dest}: {exc}")
    if action.choices is not None and value not in action.choices:
        parser.error(f"{name}={raw!r}: choose one of {', '.join(map(str, action.choices))}")
    return value


def _value(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    """The default that `name=raw` gives `action`, or `action.default` for a switch turned off."""
    if isinstance(action, argparse._StoreConstAction | argparse._AppendConstAction):
        word = raw.strip().lower()
        if word not in _TRUE | _FALSE:
            parser.error(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")
        if word in _TRUE:
            return action.const
        return False if isinstance(action, argparse._StoreTrueAction) else action.default
    if isinstance(action, argparse.BooleanOptionalAction):  # --name / --no-name
        word = raw.strip().lower()
        if word not in _TRUE | _FALSE:
            parser.error(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")
        return word in _TRUE
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        items = [_convert_one(parser, action, name, v.strip()) for v in raw.split(",") if v.strip()]
        if isinstance(action, argparse._AppendAction) and action.nargs in ("*", "+"):
            return [[item] for item in items]  # as the flag given once per item, one word each
        return items
    return _convert_one(parser, action, name, raw)


def apply_env(command: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Make each OUTPOST_* variable set in `environ` the default of `command`'s matching flag."""
    for action in command._actions:
        # An empty variable counts as unset, as compose files and manifests often leave them.
        found = next(((n, environ[n]) for n in _names(action) if environ.get(n)), None)
        if found is not None:
            action.default = _value(command, action, *found)
            action.required = False


def annotate(action: argparse.Action) -> None:
    """Append `[env: OUTPOST_*]` to the flag's help, so `--help` lists its variables (the settings
    blocks call this for each flag they generate)."""
    names = _names(action)
    if names and action.help != argparse.SUPPRESS:
        action.help = f"{action.help or ''} [env: {', '.join(names)}]".strip()


def use_environment(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    commands: Iterable[str] = ENV_COMMANDS,
) -> None:
    """Before `parser.parse_args(argv)`: env defaults for the server subcommand run (its help notes
    come with its flags: outpost/settings)."""
    name = subcommand(argv)
    command = subparsers(parser).get(name) if name in set(commands) else None
    if command is None:
        return
    apply_env(command, os.environ if environ is None else environ)
