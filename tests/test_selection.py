"""Which outputs of one agent the next agent works on."""

from __future__ import annotations

import random

import pytest

from actors.selection import select

# Outputs are (name, right) pairs: four right, four wrong.
OUTPUTS = [(f"r{i}", True) for i in range(4)] + [(f"w{i}", False) for i in range(4)]


def right(output: tuple[str, bool]) -> bool:
    return output[1]


def test_balanced_takes_both_kinds() -> None:
    chosen = select(OUTPUTS, 2, "balanced", correct=right, preferred=right, rng=random.Random(0))
    assert sorted(right(c) for c in chosen) == [False, True]


def test_balanced_with_one_pick_sees_each_kind_about_half_the_time() -> None:
    """With one output to pick, a fixed order of kinds would show the next agent only
    wrong outputs whenever any exist, and train it on one class."""
    rng = random.Random(0)
    picks = [
        right(select(OUTPUTS, 1, "balanced", correct=right, preferred=right, rng=rng)[0])
        for _ in range(400)
    ]
    assert 160 <= sum(picks) <= 240


@pytest.mark.parametrize("lean", [True, False])
def test_balanced_with_one_pick_leans_to_the_kind_asked_for(lean: bool) -> None:
    """The Verifier's training is short of one kind: a pick of one takes that kind
    whenever it exists, rather than a coin toss's."""
    rng = random.Random(0)
    picks = [
        right(select(OUTPUTS, 1, "balanced", correct=right, preferred=right, rng=rng, lean=lean)[0])
        for _ in range(50)
    ]
    assert picks == [lean] * 50


def test_balanced_fills_from_the_kind_that_exists() -> None:
    wrong_only = [o for o in OUTPUTS if not right(o)]
    chosen = select(wrong_only, 2, "balanced", correct=right, preferred=right, rng=random.Random(0))
    assert len(chosen) == 2 and not any(right(c) for c in chosen)


def test_adaptive_takes_the_preferred_outputs_first() -> None:
    def wrong(output: tuple[str, bool]) -> bool:
        return not right(output)

    chosen = select(OUTPUTS, 3, "adaptive", correct=right, preferred=wrong, rng=random.Random(0))
    assert not any(right(c) for c in chosen)


@pytest.mark.parametrize("strategy", ["random", "balanced", "adaptive"])
def test_every_strategy_takes_k_distinct_outputs(strategy: str) -> None:
    chosen = select(OUTPUTS, 3, strategy, correct=right, preferred=right, rng=random.Random(1))  # type: ignore[arg-type]
    assert len(set(chosen)) == 3


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="selection must be one of"):
        select(OUTPUTS, 1, "greedy", correct=right, preferred=right, rng=random.Random(0))  # type: ignore[arg-type]
