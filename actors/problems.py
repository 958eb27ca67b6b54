"""Where problems come from: JSONL data files, a generated arithmetic family with a
difficulty knob, and a curriculum that says which difficulty to draw next.

A data file has one JSON object a line::

    {"problem": "What is 3 + 4?", "answer": "7", "id": "p1", "split": "test"}

with ``problem`` and ``answer`` required (an integer answer is read as its decimal
text) and ``id``, ``split`` (``train`` or ``test``, default ``train``), ``difficulty``
(default 0) and ``metadata`` (strings) optional. Any other field is an error: a typo
in a field name would otherwise pass silently.

Generated arithmetic keeps its held-out problems held out: whether an expression is
train or test depends only on a hash of the expression itself, so no seed, count or
difficulty ever puts a test problem into training.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import random
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from actors.messages import Problem

Split = Literal["train", "test"]

TEST_FRACTION = 0.2
"""The share of each difficulty's expressions that the hash puts in the test split."""

DIFFICULTIES = (1, 2, 3, 4)


class ProblemFileError(ValueError):
    """A problem file that cannot be read: the message names the file, the line, and
    what is wrong there (msgspec names the field, e.g. ``at `$.answer```)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line


class _Record(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a problem file."""

    problem: str
    answer: str | int
    id: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    split: Split = "train"
    difficulty: Annotated[int, msgspec.Meta(ge=0)] = 0
    metadata: dict[str, str] = {}


_RECORD_FORMAT = (
    "each line is one JSON object with `problem` and `answer`, and optionally `id`, "
    "`split` (train or test), `difficulty` (an integer >= 0) and `metadata`"
)


def load_problems(path: str | Path) -> list[Problem]:
    """The problems of a JSONL file, in file order. Blank lines are skipped; a record
    without an ``id`` gets ``{file stem}-{line number}``.

    Raises ``ProblemFileError`` at the first malformed line or repeated id."""
    path = Path(path)
    decoder = msgspec.json.Decoder(_Record)
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = decoder.decode(line)
        except msgspec.DecodeError as error:
            raise ProblemFileError(path, number, f"{error} ({_RECORD_FORMAT})") from None
        problem_id = record.id if record.id is not None else f"{path.stem}-{number}"
        if problem_id in first_line:
            reason = f"duplicate id {problem_id!r}, first used on line {first_line[problem_id]}"
            raise ProblemFileError(path, number, reason)
        first_line[problem_id] = number
        problems.append(
            Problem(
                problem_id=problem_id,
                text=record.problem,
                answer=str(record.answer),
                split=record.split,
                difficulty=record.difficulty,
                metadata=record.metadata,
            )
        )
    return problems


def arithmetic_problems(
    count: int, *, difficulty: int = 1, split: str = "train", seed: int = 0
) -> list[Problem]:
    """``count`` arithmetic problems ("What is 3 + 4?", answer "7") of one difficulty
    and split, the same list for the same arguments.

    ====  =====================================================  =====  =====
    diff  expressions                                            train  test
    ====  =====================================================  =====  =====
    1     a + b, single digits, single-digit sum (one token)     42     13
    2     a + b, operands 0-99, two-digit sum                    4033   962
    3     a + b, a - b (a >= b) with operands 0-99; a * b, 0-12  12171  3048
    4     a op b op c, operands 0-20, op in + - *, * first       66720  16629
    ====  =====================================================  =====  =====

    The text writes the operators in ASCII, as code would ("What is 2 + 3 * 4?"). The
    list goes through the split's expressions in an order shuffled by ``seed``,
    and again, reshuffled, when ``count`` asks for more than there are; a repeat's
    ``problem_id`` carries the pass number (``arith-3+4``, then ``arith-3+4/2``), so
    ids are unique in the list. Each problem's ``metadata`` holds its ``expression``.
    """
    if count < 0:
        raise ValueError(f"count must be at least 0, got {count}")
    pool = _expressions(difficulty, split)
    rng = random.Random(seed)
    problems: list[Problem] = []
    for repeat in itertools.count(1):
        if len(problems) >= count:
            break
        order = list(pool)
        rng.shuffle(order)
        for expression in order[: count - len(problems)]:
            suffix = "" if repeat == 1 else f"/{repeat}"
            problems.append(
                Problem(
                    problem_id=f"arith-{expression}{suffix}",
                    text=f"What is {_spoken(expression)}?",
                    answer=str(_evaluate(expression)),
                    split=split,
                    difficulty=difficulty,
                    metadata={"expression": expression},
                )
            )
    return problems


def split_of(expression: str) -> Split:
    """The split a canonical expression (``3+4``, ``12-5*3``) belongs to, by its
    SHA-256: the same whatever the seed, count or difficulty that produced it."""
    digest = hashlib.sha256(expression.encode("ascii")).digest()
    return "test" if int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64 else "train"


@cache
def _expressions(difficulty: int, split: str) -> tuple[str, ...]:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return tuple(e for e in _all_expressions(difficulty) if split_of(e) == split)


def _all_expressions(difficulty: int) -> Iterator[str]:
    if difficulty == 1:
        yield from (f"{a}+{b}" for a in range(10) for b in range(10 - a))
    elif difficulty == 2:
        yield from (f"{a}+{b}" for a in range(100) for b in range(100) if 10 <= a + b <= 99)
    elif difficulty == 3:
        yield from (f"{a}+{b}" for a in range(100) for b in range(100))
        yield from (f"{a}-{b}" for a in range(100) for b in range(a + 1))
        yield from (f"{a}*{b}" for a in range(13) for b in range(13))
    else:
        operands = range(21)
        for a, b, c in itertools.product(operands, repeat=3):
            for first, second in itertools.product("+-*", repeat=2):
                yield f"{a}{first}{b}{second}{c}"


def _evaluate(expression: str) -> int:
    """The value of a canonical expression: integers joined by + - *, with * first."""
    terms: list[int] = []
    sign, product, number = 1, 1, ""
    for char in expression + "+":
        if char.isdigit():
            number += char
            continue
        product *= int(number)
        number = ""
        if char != "*":
            terms.append(sign * product)
            sign, product = (1 if char == "+" else -1), 1
    return sum(terms)


def _spoken(expression: str) -> str:
    return expression.replace("+", " + ").replace("-", " - ").replace("*", " * ")


class Curriculum:
    """Which difficulty to draw next: the lowest at first, one up once the current
    difficulty's accuracy over its last ``window`` results reaches ``threshold``.

    It only counts; the caller draws problems of ``difficulty`` and reports each
    graded answer with ``record``. A result for another difficulty (an episode still
    in flight from before a move) is kept in that difficulty's window and moves
    nothing. It never moves down, and stays at the top once there.
    """

    def __init__(
        self, difficulties: Iterable[int], *, threshold: float = 0.8, window: int = 50
    ) -> None:
        self.difficulties = sorted(set(difficulties))
        if not self.difficulties:
            raise ValueError("a curriculum needs at least one difficulty")
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.threshold = threshold
        self.window = window
        self._level = 0
        self._results = {d: collections.deque[bool](maxlen=window) for d in self.difficulties}

    @classmethod
    def for_problems(
        cls, problems: Iterable[Problem], *, threshold: float = 0.8, window: int = 50
    ) -> Curriculum:
        """A curriculum over the difficulties that ``problems`` have."""
        return cls((p.difficulty for p in problems), threshold=threshold, window=window)

    @property
    def difficulty(self) -> int:
        """The difficulty to draw the next problem from."""
        return self.difficulties[self._level]

    def record(self, difficulty: int, correct: bool) -> None:
        """Count one graded answer to a problem of ``difficulty``; move up if the
        current difficulty has now been mastered."""
        if difficulty not in self._results:
            raise ValueError(
                f"difficulty {difficulty} is not in this curriculum {self.difficulties}"
            )
        self._results[difficulty].append(correct)
        recent = self._results[self.difficulty]
        mastered = len(recent) == self.window and self._rate(recent) >= self.threshold
        if mastered and self._level + 1 < len(self.difficulties):
            self._level += 1

    def accuracy(self, difficulty: int) -> float | None:
        """The accuracy over ``difficulty``'s recent window; None before any result."""
        recent = self._results[difficulty]
        return self._rate(recent) if recent else None

    @staticmethod
    def _rate(results: collections.deque[bool]) -> float:
        return sum(results) / len(results)

    def __repr__(self) -> str:
        recent = self._results[self.difficulty]
        accuracy = self.accuracy(self.difficulty)
        shown = "-" if accuracy is None else f"{accuracy:.2f}"
        return (
            f"<Curriculum difficulty {self.difficulty} of {self.difficulties} | "
            f"accuracy {shown} over {len(recent)}/{self.window}, moves up at "
            f"{self.threshold:.2f}>"
        )


__all__ = [
    "DIFFICULTIES",
    "TEST_FRACTION",
    "Curriculum",
    "ProblemFileError",
    "Split",
    "arithmetic_problems",
    "load_problems",
    "split_of",
]
