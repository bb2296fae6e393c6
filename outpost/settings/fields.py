"""One typed table of settings and the small generator that makes their flags, env variables and help.

A settings block is a frozen pydantic model (`Block`) whose fields are declared with `setting(...)`:
the field's name, type, default and constraints are pydantic's; `setting` adds the command-line
spelling (llama-server's, e.g. `-np`/`--parallel`) and the help text. From that one declaration:

- `Block.add_to(parser)` adds the argparse flag (dest = the field's name, default None = not given),
  with its help line ending in `[env: OUTPOST_<LONG_FLAG>]`;
- the variable itself is read by outpost/envflags.py from the flag (`OUTPOST_<LONG_FLAG>`, lists
  comma-separated, switches 1/0, empty = unset), so it exists for every field with a long flag;
- `Block.from_args(namespace)` builds the typed block (a flag not given takes the field's default).

pydantic-settings is not used: its CLI turns `-np` into `--np` and its nested env names would break
the deploy files' `OUTPOST_PARALLEL`, `OUTPOST_CTX_SIZE`, ...
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from outpost import envflags
from outpost.chat.builtin_templates import BUILTIN_TEMPLATES

Action = Literal["store", "append", "store_true", "store_false", "switch"]


@dataclass(frozen=True)
class Flag:
    """How one field is spelled and explained on the command line."""

    names: tuple[str, ...]  # e.g. ("-np", "--parallel"); the long one names the env variable
    help: str
    parse: Callable[[str], Any] | None = None  # argparse `type`, also applied to the env variable
    choices: tuple[str, ...] | None = None
    action: Action = "store"
    nargs: str | None = None  # argparse's, for a flag that takes several words (--lora-scaled FILE SCALE)
    metavar: tuple[str, ...] | None = None  # the words' names in --help (default: from the long flag)


def setting(
    default: Any,
    *names: str,
    help: str,
    parse: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | None = None,
    action: Action = "store",
    nargs: str | None = None,
    metavar: tuple[str, ...] | None = None,
    **constraints: Any,
) -> Any:
    """A pydantic field that is also a flag `names` (see the module docstring).

    `constraints` are pydantic's (`ge=1`, ...); `action` is argparse's: "append" for a repeatable
    flag (a list; the env variable is comma-separated), "store_true"/"store_false" for a switch,
    "switch" for a `--name`/`--no-name` pair (llama-server's `--jinja`/`--no-jinja`)."""
    info: FieldInfo = Field(default, description=help, **constraints)
    info.metadata.append(Flag(tuple(names), help, parse, choices, action, nargs, metavar))
    return info


def flag_of(info: FieldInfo) -> Flag | None:
    return next((m for m in info.metadata if isinstance(m, Flag)), None)


class Block(BaseModel):
    """A group of settings one or more commands take; subclasses declare fields with `setting`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def flags(cls) -> dict[str, Flag]:
        """Field name -> its flag, in declaration order, a base block's shared fields after the block's
        own (so --help lists them where they were before they were shared); fields without one are
        not flags."""
        own = inspect.get_annotations(cls)
        names = sorted(cls.model_fields, key=lambda name: name not in own)  # stable: order kept within
        found = ((name, flag_of(cls.model_fields[name])) for name in names)
        return {name: flag for name, flag in found if flag is not None}

    @classmethod
    def add_to(
        cls, parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None, env: bool = True
    ) -> None:
        """Add this block's flags to `parser` (`only` those fields, when given), each with its
        `[env: ...]` help note unless the command reads no environment (`env=False`)."""
        for dest, flag in cls.flags().items():
            if only is not None and dest not in only:
                continue
            kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": flag.help}
            if flag.action in ("store", "append"):
                long = next(n for n in flag.names if n.startswith("--"))
                metavar = None if flag.choices else (flag.metavar or long[2:].upper().replace("-", "_"))
                kwargs.update(type=flag.parse, choices=flag.choices, metavar=metavar)
                if flag.nargs is not None:
                    kwargs["nargs"] = flag.nargs
            how: Any = argparse.BooleanOptionalAction if flag.action == "switch" else flag.action
            action = parser.add_argument(*flag.names, action=how, **kwargs)
            if env:
                envflags.annotate(action)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        """The block from parsed arguments; a flag not given (None), or not on this command's
        parser, takes the field's default."""
        given = {name: getattr(args, name, None) for name in cls.flags()}
        return cls.model_validate({k: v for k, v in given.items() if v is not None})


def comma_list(text: str) -> tuple[str, ...]:
    """`a, b,` -> ("a", "b")."""
    return tuple(s for s in (part.strip() for part in text.split(",")) if s)


def read_text(path: str, what: str) -> str:
    """A settings file's text; ValueError (a usage error) naming `what` when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from exc


def existing_file(path: str | None) -> str | None:
    """Validator body: the path, or ValueError when it names no file."""
    if path is not None and not Path(path).is_file():
        raise ValueError(f"file not found: {path}")
    return path


CHAT_TEMPLATE_HELP = (
    "chat template overriding the model's: a llama.cpp built-in name ("
    + ", ".join(BUILTIN_TEMPLATES)
    + "), inline jinja text, or a jinja file"
)


def chat_template_text(value: str | None, file: str | None) -> str | None:
    """llama-server's --chat-template (a built-in name or inline text; a file, as Outpost always
    took) or --chat-template-file -> the template's text (None: the model's own)."""
    if file is not None:
        return read_text(file, "chat template")
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    if Path(value).is_file():
        return read_text(value, "chat template")
    raise ValueError(
        f"--chat-template {value!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}), "
        "jinja text, nor a file"
    )


class ChatTemplateSettings(Block):
    """--chat-template and --chat-template-file, declared once for every command that renders chat:
    serve's and a worker's engine (EngineSettings), a gateway's vocab-only codecs (GatewaySettings);
    `outpost run` takes the same flags from EngineSettings."""

    chat_template: str | None = setting(None, "--chat-template", help=CHAT_TEMPLATE_HELP)
    chat_template_file: str | None = setting(
        None, "--chat-template-file", help="jinja chat template file overriding the model's"
    )

    def template_text(self) -> str | None:
        """--chat-template's (name, text or file) or --chat-template-file's text (None: the model's own)."""
        return chat_template_text(self.chat_template, self.chat_template_file)
