"""Final-answer extraction in the GSM8K convention: working, then the final answer after `####`.

A completion may also give its answer in an `<answer>…</answer>` block (the R1-style format) and may think first in a
`<think>…</think>` block, which never counts towards the answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any


# A sign (ASCII or U+2212 minus) and a `$` in either order, then digits with optional well-formed thousands commas and
# an optional fraction, or a bare fraction such as `.5`. No exponents: GSM8K answers never use them.
_PREFIX = r"(?:[-+\u2212]\$?|\$[-+\u2212]?)?"
_DIGITS = r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_PREFIX + _DIGITS)
# In running text a number is a whole token: it neither continues nor runs into a word or another number, so the `-`
# of `12-5` is no sign and `1.2.3`, `1e3` or `1,2345` hold no number.
_NUMBER_TOKEN_RE = re.compile(r"(?<![\w.,])" + _PREFIX + _DIGITS + r"(?![.,]?\w)")

THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
ANSWER_MARKER = "####"


def normalize_number(text: str) -> str | None:
    """Canonical form of a number written in `text`, or `None` if `text` is not a single number.

    Strips surrounding whitespace, one trailing `.` (end of sentence), `$`, thousands commas and a leading `+`; keeps a
    minus sign (ASCII or unicode `−`). Decimals are canonicalised exactly, by string handling: `"3.50"` -> `"3.5"`,
    `"4.0"` -> `"4"`, `".5"` -> `"0.5"`, `"-0"` -> `"0"`.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    if _NUMBER_RE.fullmatch(text) is None:
        return None
    negative = "-" in text or "\u2212" in text
    digits = re.sub(r"[-+\u2212$,]", "", text)
    integer, _, fraction = digits.partition(".")
    integer = integer.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    canonical = f"{integer}.{fraction}" if fraction else integer
    return f"-{canonical}" if negative and canonical != "0" else canonical


def _numbers(text: str) -> list[str]:
    """The normalized numbers of `text`, in order of appearance."""
    return [normalize_number(match.group()) for match in _NUMBER_TOKEN_RE.finditer(text)]


def _answer_block(text: str) -> str | None:
    """Content of the last complete `<answer>…</answer>` block, or `None` if there is none.

    The block is the last closing tag and the nearest opening tag before it, so an earlier unclosed or nested
    `<answer>` does not swallow the block.
    """
    end = text.rfind(ANSWER_CLOSE)
    if end == -1:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start == -1:
        return None
    return text[start + len(ANSWER_OPEN) : end]


def extract_answer(text: str) -> str | None:
    """The normalized final answer of a completion, or `None` if it gives none in the expected format.

    Only the text after the last `</think>` counts. Then, by priority:

    1. the last `<answer>…</answer>` block: its content if that is a bare number, else the last number inside it;
    2. the text after the last `####`: the first number in it;
    3. otherwise `None`.

    There is deliberately no "last number anywhere" fallback: the format is part of what is rewarded, so a completion
    that states a number without a marker gets no answer. Malformed text never raises; it gives `None`.
    """
    if not isinstance(text, str):
        return None
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    block = _answer_block(text)
    if block is not None:
        bare = normalize_number(block)
        if bare is not None:
            return bare
        numbers = _numbers(block)
        return numbers[-1] if numbers else None
    if ANSWER_MARKER in text:
        numbers = _numbers(text.rsplit(ANSWER_MARKER, 1)[1])
        return numbers[0] if numbers else None
    return None


def _concluding_number(line: str) -> str | None:
    """The number a line concludes with: an equation's result (the first number after its last `=`), else the line's
    first number (`4 + 13 = 17` → 17; `17 apples (4 + 13)` → 17)."""
    if "=" in line:
        numbers = _numbers(line.rsplit("=", 1)[1])
        if numbers:
            return numbers[0]
    numbers = _numbers(line)
    return numbers[0] if numbers else None


def final_number(text: str) -> str | None:
    """The answer a reader would take from `text`, marker or not: an `<answer>` block's as `extract_answer` reads it;
    else the number the first line after the last `####` concludes with (`#### 4 + 13 = 17` → 17, where the strict
    reading takes 4); else the last number anywhere in it.

    The task's rewards use `extract_answer`: the prompt asks for the final answer after `####`, and GSM8K's strict
    reading takes the number that follows it. This lenient reading measures what a model knows whether or not it
    writes that format, e.g. a chat model that ends with "so 7 + 12 = 19." and no marker, or one that writes the
    whole sum after the marker. A marker that gives no number falls back to the last number anywhere."""
    if not isinstance(text, str):
        return None
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    if _answer_block(text) is not None:
        answer = extract_answer(text)
    elif ANSWER_MARKER in text:
        answer = _concluding_number(text.rsplit(ANSWER_MARKER, 1)[1].strip().split("\n", 1)[0])
    else:
        answer = None
    if answer is not None:
        return answer
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def has_answer_format(text: str) -> bool:
    """Whether `text` gives a final answer through a marker (`####` or an `<answer>` block)."""
    # `extract_answer` only ever finds an answer through a marker.
    return extract_answer(text) is not None


def answers_match(predicted: str | None, gold: str | int | float) -> bool:
    """Whether `predicted` and `gold` are the same number once normalized (`"1,234"` matches `1234`).

    `None`, or anything that is not a number on either side, never matches.
    """
    if predicted is None or isinstance(gold, bool):
        return False
    if isinstance(gold, float):
        # `str(1e20)` is `"1e+20"`; go through `Decimal` for a plain positional form (`nan`/`inf` stay unparseable).
        try:
            gold = format(Decimal(repr(gold)), "f")
        except InvalidOperation:
            return False
    elif not isinstance(gold, str):
        gold = str(gold)
    predicted, gold = normalize_number(predicted), normalize_number(gold)
    return predicted is not None and predicted == gold


def _content_text(content: Any) -> str:
    if content is None:  # e.g. an assistant message that only makes tool calls
        return ""
    if isinstance(content, str):
        return content
    # A list of parts: join the text parts, on newlines so that numbers in adjacent parts never fuse.
    texts = [part if isinstance(part, str) else part.get("text") for part in content if part is not None]
    return "\n".join(text for text in texts if isinstance(text, str) and text)


def completion_text(completion: str | list[Mapping[str, Any]] | Mapping[str, Any]) -> str:
    """The text of a completion as TRL passes it to reward functions.

    A standard completion is a string. A conversational one is a list of messages (`[{"role": "assistant", "content":
    ...}]`); its text is the content of the last assistant message (`""` if there is none), where a content made of
    parts (`[{"type": "text", "text": ...}]`) is their text joined by newlines.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    for message in reversed(list(completion)):
        if message.get("role", "assistant") == "assistant":
            return _content_text(message.get("content"))
    return ""
