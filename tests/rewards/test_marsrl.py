"""MarsRL's rewards are 0 or 1: Solver and Corrector for their own answer, the
Verifier for a verdict that agrees with the truth about the solution it judged, and in
trajectory mode every agent for the episode's final solution."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rewards.marsrl import (
    Reward,
    Role,
    corrector_reward,
    marsrl_reward,
    parse_verdict,
    solution_correct,
    solver_reward,
    trajectory_reward,
    verifier_reward,
)

RIGHT = "7 - 4 = 3, so the answer is \\boxed{3}."
WRONG = "7 - 4 = 2, so the answer is \\boxed{2}."


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("The solution is sound.\nCorrect", "Correct"),
        ("Step 2 is Wrong.\nCorrect", "Correct"),
        ("Looks Correct at first.\nWrong", "Wrong"),
        ("**Wrong**", "Wrong"),
        ("Verdict: Correct.", "Correct"),
        ("Incorrect", None),
        ("correct", None),
        ("Correctly computed. Wrongful.", None),
        ("", None),
    ],
)
def test_the_last_standalone_verdict_word_wins(text: str, verdict: str | None) -> None:
    assert parse_verdict(text) == verdict


@pytest.mark.parametrize(
    ("judged_correct", "report", "reward"),
    [
        (True, "No issues.\nCorrect", 1.0),
        (True, "Critical error in step 2.\nWrong", 0.0),
        (False, "Critical error in step 2.\nWrong", 1.0),
        (False, "No issues.\nCorrect", 0.0),
        (True, "I cannot tell.", 0.0),
        (False, "I cannot tell.", 0.0),
    ],
)
def test_a_verifier_is_rewarded_for_agreeing_with_the_truth(
    judged_correct: bool, report: str, reward: float
) -> None:
    assert verifier_reward(report, judged_correct) == Reward(reward, {"verdict_agrees": reward})


def test_a_verifier_reward_reads_a_verdict_already_parsed() -> None:
    assert verifier_reward("Wrong", judged_correct=False).value == 1.0
    assert verifier_reward("", judged_correct=False).value == 0.0


@pytest.mark.parametrize("reward", [solver_reward, corrector_reward])
def test_solver_and_corrector_are_rewarded_for_their_own_answer(
    reward: Callable[[str | None, str], Reward],
) -> None:
    assert reward("3", "3") == Reward(1.0, {"answer_correct": 1.0})
    assert reward("\\frac{6}{2}", "3") == Reward(1.0, {"answer_correct": 1.0})
    assert reward("2", "3") == Reward(0.0, {"answer_correct": 0.0})
    assert reward("", "3") == Reward(0.0, {"answer_correct": 0.0})
    assert reward(None, "3") == Reward(0.0, {"answer_correct": 0.0})


def test_a_solution_is_correct_when_its_final_answer_is() -> None:
    assert solution_correct(RIGHT, "3")
    assert not solution_correct(WRONG, "3")
    assert not solution_correct("I give up.", "3")


@pytest.mark.parametrize(
    ("role", "output", "judged", "reward"),
    [
        ("solver", RIGHT, "", 1.0),
        ("solver", WRONG, "", 0.0),
        ("corrector", RIGHT, "", 1.0),
        ("verifier", "Correct", RIGHT, 1.0),
        ("verifier", "Wrong", RIGHT, 0.0),
        ("verifier", "Wrong", WRONG, 1.0),
        ("verifier", "Correct", WRONG, 0.0),
    ],
)
def test_agent_rewards_from_whole_outputs(
    role: Role, output: str, judged: str, reward: float
) -> None:
    assert marsrl_reward(role, output, "3", judged_solution=judged).value == reward


@pytest.mark.parametrize("role", ["solver", "verifier", "corrector"])
def test_trajectory_mode_gives_every_agent_the_final_outcome(role: Role) -> None:
    right = marsrl_reward(role, WRONG, "3", final_solution=RIGHT, mode="trajectory")
    wrong = marsrl_reward(role, RIGHT, "3", final_solution=WRONG, mode="trajectory")
    assert right == trajectory_reward(True) == Reward(1.0, {"final_correct": 1.0})
    assert wrong == trajectory_reward(False) == Reward(0.0, {"final_correct": 0.0})


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="no role 'judge'"):
        marsrl_reward("judge", RIGHT, "3")  # type: ignore[arg-type]
