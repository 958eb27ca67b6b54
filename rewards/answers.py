"""Reading a final answer out of model output and deciding whether it equals a reference.

Both jobs go through Hugging Face's ``math-verify``: it extracts LaTeX and plain
expressions, normalises them and compares them with sympy, so ``0.5``, ``1/2`` and
``\\frac12`` are one answer. Model output is hostile input (endless text, unbalanced
braces, ``9^{9^{9^9}}``), so every function here returns None or False instead of
raising, and the work is bounded three ways:

* only the last ``TAIL_CHARS`` characters of an output are read (a final answer comes
  at the end) and an answer longer than ``MAX_ANSWER_CHARS`` is never compared;
* in the main thread, math-verify's own timeouts (``parsing_timeout``,
  ``timeout_seconds``) stop a parse or a comparison after ``TIMEOUT_S`` seconds. They
  work by ``SIGALRM`` and hold the thread while they run: on a pathological answer an
  event loop calling these functions stalls for up to ``TIMEOUT_S`` per parse or
  comparison (a few seconds at worst), and nothing else in the process may use
  ``SIGALRM``;
* off the main thread signals cannot be used (math-verify refuses), so the timeouts
  are switched off there. Short text is no protection then, since a 15-character
  power tower keeps sympy busy for ever, so an answer whose comparison could explode
  (an exponent or factorial argument that is not a small number) is judged not
  equivalent instead.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import sympy  # type: ignore[import-untyped]
from math_verify import parse, verify  # type: ignore[import-untyped]
from math_verify.errors import TimeoutException  # type: ignore[import-untyped]

__all__ = ["MAX_ANSWER_CHARS", "TAIL_CHARS", "TIMEOUT_S", "extract_answer", "is_equivalent"]

TAIL_CHARS = 4000
"""How much of the end of an output is searched for its answer."""
MAX_ANSWER_CHARS = 1000
"""Longer than this is not a final answer; such text is never handed to sympy."""
TIMEOUT_S = 1
"""math-verify's limit per parse and per comparison, in whole seconds (``signal.alarm``)."""
MAX_EXPONENT = 1000
"""Off the main thread: the largest exponent or factorial argument compared."""

_BOXED = re.compile(r"\\boxed\s*\{")

# math-verify logs a warning with the whole input on every timeout, and one when
# timeouts are off; both are expected here and would flood a node's log.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the content of the last complete ``\\boxed{...}``,
    else the last expression math-verify can parse (a trailing number, a LaTeX formula);
    None when nothing parses."""
    tail = text[-TAIL_CHARS:]
    boxed = _last_boxed(tail)
    if boxed is not None:
        return boxed
    found = _parse(tail)
    if not any(not isinstance(item, str) for item in found):
        return None
    strings = [item for item in found if isinstance(item, str)]
    return strings[-1].strip() if strings else str(found[0])


def is_equivalent(answer_text: str, reference: str) -> bool:
    """Whether the answer ``answer_text`` (as ``extract_answer`` returns it, not a whole
    output) is mathematically the reference answer ``reference``."""
    if not answer_text.strip() or not reference.strip():
        return False
    if len(answer_text) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    gold, target = _parse_answer(reference), _parse_answer(answer_text)
    if not gold or not target:
        return False
    timeout = _timeout()
    if timeout is None and (_could_explode(gold) or _could_explode(target)):
        return False
    try:
        return bool(verify(gold, target, timeout_seconds=timeout))
    except (Exception, TimeoutException):
        return False


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close and that is not empty;
    escaped braces (``\\{``) inside it do not count."""
    for start in reversed([m.end() for m in _BOXED.finditer(text)]):
        depth, i = 1, start
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        return content
                    break
            i += 1
    return None


def _parse_answer(answer: str) -> list[Any]:
    """A bare answer parsed as if it had been boxed, which makes math-verify read it as
    LaTeX without delimiters (``\\frac12`` alone parses to nothing); plain parsing is the
    fallback for text LaTeX cannot read."""
    parsed = _parse(f"\\boxed{{{answer}}}")
    if any(not isinstance(item, str) for item in parsed):
        return parsed
    return _parse(answer)


def _parse(text: str) -> list[Any]:
    try:
        return list(parse(text, parsing_timeout=_timeout()))
    except (Exception, TimeoutException):
        return []


def _timeout() -> int | None:
    """math-verify's timeouts use ``signal.alarm``, which only the main thread may set."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _could_explode(parsed: list[Any]) -> bool:
    """Whether evaluating a parsed answer could take unbounded time: a power or
    factorial whose exponent or argument is not a number of at most ``MAX_EXPONENT``."""
    for item in parsed:
        if not isinstance(item, sympy.Basic):
            continue
        for node in sympy.preorder_traversal(item):
            if isinstance(node, sympy.Pow):
                argument = node.exp
            elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.gamma)):
                argument = node.args[0]
            else:
                continue
            if not _small(argument):
                return True
    return False


def _small(value: Any) -> bool:
    if not value.is_Atom:
        return False
    return not value.is_Number or bool(abs(value) <= MAX_EXPONENT)
