"""MarsRL's rewards: agent-specific by default, trajectory-level for comparison.

Agent-specific rewards judge each agent on its own job, so a Verifier that rightly
flags a wrong solution is rewarded even when the episode ends wrong; MarsRL uses them
against the reward noise of crediting every agent with the episode's outcome. All
rewards are 0 or 1:

* Solver and Corrector: 1 if their own answer equals the reference answer.
* Verifier: 1 if its verdict agrees with the true correctness of the solution it
  judged (right and "Correct", or wrong and "Wrong"); a report without a verdict
  scores 0.
* Trajectory mode: every agent of an episode gets whether the episode's final
  solution is correct.

The functions are pure, over plain values, and return a ``Reward``: the value and the
named parts it was built from, which become a ``ScoredSegment``'s ``reward`` and
``parts``.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from rewards.answers import extract_answer, is_equivalent

__all__ = [
    "Reward",
    "RewardMode",
    "Role",
    "Verdict",
    "corrector_reward",
    "marsrl_reward",
    "parse_verdict",
    "solution_correct",
    "solver_reward",
    "trajectory_reward",
    "verifier_reward",
]

Role = Literal["solver", "verifier", "corrector"]
Verdict = Literal["Correct", "Wrong"]
RewardMode = Literal["agent", "trajectory"]

_VERDICT = re.compile(r"\b(Correct|Wrong)\b")


class Reward(NamedTuple):
    value: float
    parts: dict[str, float]


def parse_verdict(text: str) -> Verdict | None:
    """The verdict of a Verifier's report: its correctness line says ``Correct`` or
    ``Wrong``, so the last of those words standing alone (case-sensitive; "Incorrect"
    and "correct" do not count) wins. None when neither appears."""
    words = _VERDICT.findall(text)
    if not words:
        return None
    return "Correct" if words[-1] == "Correct" else "Wrong"


def solution_correct(solution: str, reference: str) -> bool:
    """Whether a whole solution's final answer equals the reference answer."""
    answer = extract_answer(solution)
    return answer is not None and is_equivalent(answer, reference)


def solver_reward(answer: str | None, reference: str) -> Reward:
    """A Solver's reward for the answer read from its output (``extract_answer``'s
    result; "" or None when it gave none)."""
    correct = bool(answer) and is_equivalent(answer or "", reference)
    return Reward(float(correct), {"answer_correct": float(correct)})


def corrector_reward(answer: str | None, reference: str) -> Reward:
    """A Corrector is rewarded as a Solver is: for its own revised answer."""
    return solver_reward(answer, reference)


def verifier_reward(report: str, judged_correct: bool) -> Reward:
    """A Verifier's reward: 1 if the verdict of ``report`` (the whole report or the
    verdict already read from it) agrees with ``judged_correct``, the true correctness
    of the solution it judged; 0 for a report without a verdict."""
    verdict = parse_verdict(report)
    agrees = verdict is not None and (verdict == "Correct") == judged_correct
    return Reward(float(agrees), {"verdict_agrees": float(agrees)})


def trajectory_reward(final_correct: bool) -> Reward:
    """The trajectory-level reward every agent of an episode gets: whether the
    episode's final solution is correct."""
    return Reward(float(final_correct), {"final_correct": float(final_correct)})


def marsrl_reward(
    role: Role,
    output: str,
    reference: str,
    *,
    judged_solution: str = "",
    final_solution: str = "",
    mode: RewardMode = "agent",
) -> Reward:
    """The reward of one agent's ``output`` in an episode on a problem whose answer is
    ``reference``. A Verifier's reward needs ``judged_solution``, the solution it
    judged; trajectory mode needs ``final_solution``, the episode's last solution."""
    if role not in ("solver", "verifier", "corrector"):
        raise ValueError(f"MarsRL has no role {role!r}; its roles are solver, verifier, corrector")
    if mode == "trajectory":
        return trajectory_reward(solution_correct(final_solution, reference))
    if role == "verifier":
        return verifier_reward(output, solution_correct(judged_solution, reference))
    return solver_reward(extract_answer(output), reference)
