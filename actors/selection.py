"""Which outputs of one agent the next agent works on (MarsRL's grouped agentic
rollouts: each later agent takes ``k`` outputs of the previous one and samples a group
for each).

``random`` draws ``k`` uniformly. ``balanced`` takes as many outputs that were right as
ones that were wrong, as far as both exist, so the next agent sees both kinds; an odd
``k`` leans to the kind ``lean`` names (right when True), or to a coin toss's, so
``k`` = 1 sees each kind half the time. The Verifier's training leans to the kind it is
short of: while the Solver is rarely right, a coin toss wasted half of the few right
solutions on groups that verdict balancing then held back.
``adaptive`` (the paper's best) fills ``k`` with the outputs the next agent learns most
from first, ``preferred``: for the Verifier, wrong solutions; for the Corrector, error
reports that are right.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

T = TypeVar("T")

Strategy = Literal["random", "balanced", "adaptive"]
STRATEGIES: tuple[Strategy, ...] = ("random", "balanced", "adaptive")


def select(
    candidates: Sequence[T],
    k: int,
    strategy: Strategy,
    *,
    correct: Callable[[T], bool],
    preferred: Callable[[T], bool],
    rng: random.Random,
    lean: bool | None = None,
) -> list[T]:
    if strategy not in STRATEGIES:
        raise ValueError(f"selection must be one of {STRATEGIES}, got {strategy!r}")
    pool = list(candidates)
    rng.shuffle(pool)
    if len(pool) <= k:
        return pool
    if strategy == "random":
        return pool[:k]
    if strategy == "adaptive":
        return sorted(pool, key=lambda c: not preferred(c))[:k]
    right = [c for c in pool if correct(c)]
    wrong = [c for c in pool if not correct(c)]
    sides = [wrong, right]
    if lean is None:
        rng.shuffle(sides)
    elif lean:
        sides.reverse()
    chosen: list[T] = []
    while len(chosen) < k:
        for side in sides:
            if side and len(chosen) < k:
                chosen.append(side.pop())
    return chosen
