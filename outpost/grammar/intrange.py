"""GBNF for integers within bounds: JSON schema's `minimum`/`maximum` on `type: integer`.

A Python port of `build_min_max_int` from llama.cpp's common/json-schema-to-grammar.cpp (as
vendored in the llama-cpp-python 0.3.36 sdist; MIT, Copyright (c) 2023-2024 The ggml authors).
It writes digit-by-digit alternatives, so `maximum: 7` admits exactly 0..7 and a model can never
emit a 16-digit number where a small one is required.
"""

from __future__ import annotations

from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def int_bounds(schema: dict[str, Any]) -> tuple[int, int] | None:
    """(min, max) from a schema's bounds (INT64_MIN/MAX where open), or None when it has none."""
    lo, hi = INT64_MIN, INT64_MAX
    found = False
    if "minimum" in schema:
        lo, found = _ceil(schema["minimum"]), True
    elif "exclusiveMinimum" in schema:
        lo, found = _floor(schema["exclusiveMinimum"]) + 1, True
    if "maximum" in schema:
        hi, found = _floor(schema["maximum"]), True
    elif "exclusiveMaximum" in schema:
        hi, found = _ceil(schema["exclusiveMaximum"]) - 1, True
    if not found:
        return None
    if lo > hi:
        raise ValueError(f"integer bounds are empty: minimum {lo} > maximum {hi}")
    return max(lo, INT64_MIN), min(hi, INT64_MAX)


def _number(value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"integer bounds must be numbers, got {value!r}")
    return value


def _floor(value: Any) -> int:
    v = _number(value)
    return int(v) if v >= 0 or int(v) == v else int(v) - 1


def _ceil(value: Any) -> int:
    return -_floor(-_number(value))


def min_max_int_rule(min_value: int, max_value: int) -> str:
    """A GBNF expression (no rule name) matching the decimal integers in [min_value, max_value]."""
    out: list[str] = []
    _build(min_value, max_value, out, 16, True)
    return "".join(out)


def _digit_range(out: list[str], lo: str, hi: str) -> None:
    out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")


def _more_digits(out: list[str], min_digits: int, max_digits: int | None) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits))
    if max_digits != min_digits:
        out.append("," + ("" if max_digits is None else str(max_digits)))
    out.append("}")


def _uniform_range(out: list[str], lo: str, hi: str) -> None:
    """Numbers with as many digits as `lo` (== len(hi)), from lo to hi."""
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    if i > 0:
        out.append(f'"{lo[:i]}"')
    if i >= len(lo) or i >= len(hi):
        return
    if i > 0:
        out.append(" ")
    sub_len = len(lo) - i - 1
    if sub_len == 0:
        out.append(f"[{lo[i]}-{hi[i]}]")
        return
    lo_sub, hi_sub = lo[i + 1 :], hi[i + 1 :]
    zeros, nines = "0" * sub_len, "9" * sub_len
    to_reached = False
    out.append("(")
    if lo_sub == zeros:
        _digit_range(out, lo[i], chr(ord(hi[i]) - 1))
        out.append(" ")
        _more_digits(out, sub_len, sub_len)
    else:
        out.append(f"[{lo[i]}] (")
        _uniform_range(out, lo_sub, nines)
        out.append(")")
        if ord(lo[i]) < ord(hi[i]) - 1:
            out.append(" | ")
            if hi_sub == nines:
                _digit_range(out, chr(ord(lo[i]) + 1), hi[i])
                to_reached = True
            else:
                _digit_range(out, chr(ord(lo[i]) + 1), chr(ord(hi[i]) - 1))
            out.append(" ")
            _more_digits(out, sub_len, sub_len)
    if not to_reached:
        out.append(" | ")
        _digit_range(out, hi[i], hi[i])
        out.append(" ")
        _uniform_range(out, zeros, hi_sub)
    out.append(")")


def _build(lo: int, hi: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    has_min, has_max = lo != INT64_MIN, hi != INT64_MAX
    if has_min and has_max:
        _build_closed(lo, hi, out, decimals_left)
    elif has_min:
        _build_min(lo, out, decimals_left, top_level)
    elif has_max:
        _build_max(hi, out, decimals_left, top_level)
    else:
        raise ValueError("at least one of min_value or max_value must be set")


def _build_closed(lo: int, hi: int, out: list[str], decimals_left: int) -> None:
    if lo < 0 and hi < 0:
        out.append('"-" (')
        _build(-hi, -lo, out, decimals_left, True)
        out.append(")")
        return
    if lo < 0:
        out.append('"-" (')
        _build(0, -lo, out, decimals_left, True)
        out.append(") | ")
        lo = 0
    lo_s, hi_s = str(lo), str(hi)
    for digits in range(len(lo_s), len(hi_s)):
        _uniform_range(out, lo_s, "9" * digits)
        lo_s = "1" + "0" * digits
        out.append(" | ")
    _uniform_range(out, lo_s, hi_s)


def _build_min(lo: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    less = max(decimals_left - 1, 1)
    if lo < 0:
        out.append('"-" (')
        _build(INT64_MIN, -lo, out, decimals_left, False)
        out.append(") | [0] | [1-9] ")
        _more_digits(out, 0, decimals_left - 1)
    elif lo == 0:
        if top_level:
            out.append("[0] | [1-9] ")
            _more_digits(out, 0, less)
        else:
            _more_digits(out, 1, decimals_left)
    elif lo <= 9:
        c = str(lo)
        start = "1" if top_level else "0"
        if c > start:
            _digit_range(out, start, chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, 1, less)
            out.append(" | ")
        _digit_range(out, c, "9")
        out.append(" ")
        _more_digits(out, 0, less)
    else:
        lo_s = str(lo)
        c = lo_s[0]
        if c > "1":
            _digit_range(out, "1" if top_level else "0", chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, len(lo_s), less)
            out.append(" | ")
        # the digits after `c`: as many as the rest and at least it, or more of any value
        # (upstream recursed with int(rest) and so let 500 admit 50)
        rest = lo_s[1:]
        _digit_range(out, c, c)
        out.append(" ((")
        _uniform_range(out, rest, "9" * len(rest))
        out.append(")")
        if len(rest) < less:
            out.append(" | ")
            _more_digits(out, len(rest) + 1, less)
        out.append(")")
        if c < "9":
            out.append(" | ")
            _digit_range(out, chr(ord(c) + 1), "9")
            out.append(" ")
            _more_digits(out, len(lo_s) - 1, less)


def _build_max(hi: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    less = max(decimals_left - 1, 1)
    if hi >= 0:
        if top_level:
            out.append('"-" [1-9] ')
            _more_digits(out, 0, less)
            out.append(" | ")
        _build(0, hi, out, decimals_left, True)
    else:
        out.append('"-" (')
        _build(-hi, INT64_MAX, out, decimals_left, False)
        out.append(")")
