"""TextStream: UTF-8 safe incremental text and stop strings that never leak, even in part."""

from __future__ import annotations

import random

import pytest

from outpost.scheduler.textstream import TextStream


def run(pieces: list[bytes], stop: tuple[str, ...] = ()) -> tuple[list[str], bool, str]:
    """Feeds every piece; returns the deltas, whether it stopped, and the text incl. the flush."""
    stream = TextStream(stop)
    deltas = []
    stopped = False
    for p in pieces:
        delta, stopped = stream.feed(p)
        deltas.append(delta)
        if stopped:
            break
    tail = "" if stopped else stream.finish()
    return deltas, stopped, "".join(deltas) + tail


def test_ascii_passes_through_at_once() -> None:
    deltas, stopped, text = run([b"Hel", b"lo", b" world"])
    assert deltas == ["Hel", "lo", " world"]
    assert not stopped and text == "Hello world"


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        ([b"\xc3", b"\xa9"], ["", "é"]),
        ([b"\xe2", b"\x82", b"\xac!"], ["", "", "€!"]),
        ([b"a\xf0\x9f", b"\x98", b"\x80b"], ["a", "", "😀b"]),
    ],
)
def test_multibyte_characters_split_over_tokens_are_held_whole(
    pieces: list[bytes], expected: list[str]
) -> None:
    deltas, _, _ = run(pieces)
    assert deltas == expected


def test_invalid_bytes_become_replacement_characters() -> None:
    _, _, text = run([b"a\xff", b"b"])
    assert text == "a\ufffdb"


def test_incomplete_character_at_the_end_is_flushed_as_replacement() -> None:
    stream = TextStream()
    assert stream.feed(b"ok\xe2\x82") == ("ok", False)
    assert stream.finish() == "\ufffd"


def test_stop_string_inside_one_piece_cuts_the_text() -> None:
    _deltas, stopped, text = run([b"hello STOP world"], ("STOP",))
    assert stopped and text == "hello "


def test_stop_string_split_over_pieces_never_leaks() -> None:
    deltas, stopped, text = run([b"ab", b"cS", b"T", b"O", b"Pzz"], ("STOP",))
    assert deltas == ["ab", "c", "", "", ""]
    assert stopped and text == "abc"


def test_partial_match_that_fails_is_released() -> None:
    deltas, stopped, text = run([b"xST", b"OX", b"y"], ("STOP",))
    assert deltas == ["x", "STOX", "y"]
    assert not stopped and text == "xSTOXy"


def test_overlapping_prefixes_keep_the_longest_possible_match() -> None:
    deltas, stopped, text = run([b"a", b"a", b"a", b"b"], ("aab",))
    assert deltas == ["", "", "a", ""]
    assert stopped and text == "a"


def test_earliest_stop_string_wins() -> None:
    _, stopped, text = run([b"hello world"], ("world", "lo"))
    assert stopped and text == "hel"


def test_stop_string_ending_in_a_split_character() -> None:
    deltas, stopped, text = run([b"x\xc3", b"\xa9", b"!"], ("é!",))
    assert deltas == ["x", "", ""]
    assert stopped and text == "x"


def test_finish_flushes_a_partial_match() -> None:
    stream = TextStream(("abc",))
    assert stream.feed(b"xab") == ("x", False)
    assert stream.held == "ab"
    assert stream.finish() == "ab"


def test_empty_stop_strings_are_ignored() -> None:
    _, stopped, text = run([b"abc"], ("",))
    assert not stopped and text == "abc"


def test_nothing_after_a_stop() -> None:
    stream = TextStream(("x",))
    assert stream.feed(b"ax") == ("a", True)
    assert stream.stopped
    assert stream.feed(b"more") == ("", True)
    assert stream.finish() == ""


def test_random_splits_match_whole_decoding() -> None:
    """Any split of the bytes gives the same text, and what was shown is never taken back."""
    rng = random.Random(7)
    alphabet = ["a", "b", "S", "T", "O", "P", "é", "€", "😀", " "]
    stops = ("STOP", "é€", "bb")
    for _ in range(300):
        full = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        data = full.encode()
        cuts = (
            sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 8)))) if data else []
        )
        pieces = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        hits = [i for i in (full.find(s) for s in stops) if i >= 0]
        expected = full[: min(hits)] if hits else full
        deltas, stopped, text = run(pieces, stops)
        assert text == expected, (full, pieces)
        assert stopped == bool(hits)
        for s in stops:  # no partial stop string was ever shown beyond the real text
            assert s not in "".join(deltas)


def test_prime_keeps_only_what_was_held_back() -> None:
    stream = TextStream(("STOP",))
    stream.prime(b"shown already ST")  # "ST" was held back by the stream that showed the rest
    assert stream.held == "ST"
    assert stream.feed(b"OP and more") == ("", True)


def test_prime_keeps_a_split_character() -> None:
    stream = TextStream()
    stream.prime(b"caf\xc3")
    assert stream.feed(b"\xa9!") == ("é!", False)


def test_random_resume_points_continue_the_text_exactly() -> None:
    """A stream primed with the pieces before any cut shows exactly the rest of one whole run."""
    rng = random.Random(11)
    alphabet = ["a", "S", "T", "O", "P", "é", "€", "😀", " "]
    stops = ("STOP", "é€")
    for _ in range(300):
        data = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20))).encode()
        cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 8))))
        pieces = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        deltas, _, expected = run(pieces, stops)
        for cut in range(len(deltas)):  # the old stream showed deltas[:cut], then was cut off
            rest = run_primed(b"".join(pieces[:cut]), pieces[cut:], stops)
            assert "".join(deltas[:cut]) + rest == expected, (data, pieces, cut)


def run_primed(shown: bytes, pieces: list[bytes], stop: tuple[str, ...]) -> str:
    """The text a stream primed with output already shown elsewhere adds for `pieces`."""
    stream = TextStream(stop)
    stream.prime(shown)
    text = ""
    for p in pieces:
        delta, stopped = stream.feed(p)
        text += delta
        if stopped:
            return text
    return text + stream.finish()
