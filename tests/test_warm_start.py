"""The warm start's examples: what each role is taught before RL."""

from __future__ import annotations

import re

from actors.problems import arithmetic_problems
from actors.warm_start import format_examples
from rewards.answers import extract_answer


def _corrector_examples(correct: float) -> list[tuple[str, str, str]]:
    """(reference answer, the review's result, the target's answer) of every Corrector
    example."""
    problems = arithmetic_problems(500, difficulty=2)
    answers = {p.text: p.answer for p in problems}
    roles = ["solver", "verifier", "corrector"]
    examples = format_examples(roles, problems, 3000, correct=correct, seed=0)
    rows = []
    for chat, target in examples:
        if len(chat) != 4:
            continue
        (review,) = re.findall(r"\\boxed\{(\d+)\}", chat[3].content)
        rows.append((answers[chat[1].content], review, extract_answer(target) or ""))
    return rows


def test_a_corrector_cannot_learn_its_answer_by_copying_the_review() -> None:
    rows = _corrector_examples(correct=1.0)
    assert len(rows) == 1000
    assert all(target == reference for reference, _, target in rows)
    review_right = sum(review == reference for reference, review, _ in rows) / len(rows)
    assert 0.4 < review_right < 0.6


def test_the_corrector_targets_are_right_as_often_as_the_recipe_says() -> None:
    rows = _corrector_examples(correct=0.3)
    right = sum(target == reference for reference, _, target in rows) / len(rows)
    assert 0.25 < right < 0.35
