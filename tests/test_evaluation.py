"""The test-time loop of MarsRL's evaluation (accept after consecutive passes, give up
after consecutive failures, fall back to the most-passed candidate), the balanced
verdict accuracy, and MAPPA's evaluation pass, over scripted teams."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from actors.evaluation import EvalSettings, evaluate, solve_with_review
from actors.messages import AgentOutput, Problem, SamplingParams, ScoredSegment, Segment
from rewards.sandbox import extract_code

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


PROBLEM = Problem("p", "What is 3 + 4?", "7")
SETTINGS = EvalSettings()
SEGMENT_IDS = itertools.count()


def output(role: str, text: str, answer: str = "", verdict: str = "") -> AgentOutput:
    segment = Segment(
        segment_id=f"{role}/{next(SEGMENT_IDS)}",
        episode_id="e",
        sample_id="s",
        parent_id="",
        group="g",
        group_size=1,
        role=role,
        policy="team",
        prompt_ids=np.array([1], dtype=np.int32),
        completion_ids=np.array([2], dtype=np.int32),
        logprobs=np.array([-1.0], dtype=np.float32),
        versions=np.array([0], dtype=np.int32),
        finish_reason="stop",
        text=text,
    )
    return AgentOutput(segment, answer=answer, verdict=verdict, code=extract_code(text) or "")


class ScriptedTeam:
    """Each role answers from its own script, in order; every call is recorded."""

    def __init__(self, **scripts: Iterator[AgentOutput]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[str, dict[str, str], int | None, SamplingParams | None]] = []

    async def act(
        self,
        episode: str,
        role: str,
        inputs: dict[str, str],
        parent_id: str,
        *,
        group_size: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> list[AgentOutput]:
        self.calls.append((role, inputs, group_size, sampling))
        return [next(self.scripts[role])]

    async def emit(self, scored: list[ScoredSegment]) -> None:
        raise AssertionError("evaluation must not train")

    def count(self, role: str) -> int:
        return sum(call[0] == role for call in self.calls)


def answers(*values: str, role: str = "solver") -> Iterator[AgentOutput]:
    return iter([output(role, f"\\boxed{{{v}}}", v) for v in values])


def verdicts(*words: str) -> Iterator[AgentOutput]:
    return iter([output("verifier", w, verdict=w) for w in words])


async def test_four_passes_in_a_row_accept_the_solvers_answer() -> None:
    team = ScriptedTeam(solver=answers("7"), verifier=verdicts(*["Correct"] * 4))
    outcome = await solve_with_review(team, PROBLEM, SETTINGS)
    assert (outcome.solver_correct, outcome.system_correct, outcome.accepted) == (True, True, True)
    assert outcome.reviews == 4 and team.count("corrector") == 0
    assert all(size == 1 and sampling == SETTINGS.sampling for _, _, size, sampling in team.calls)


async def test_a_flagged_error_goes_to_the_corrector_with_the_report() -> None:
    team = ScriptedTeam(
        solver=answers("6"),
        verifier=verdicts("Wrong", *["Correct"] * 4),
        corrector=answers("7", role="corrector"),
    )
    outcome = await solve_with_review(team, PROBLEM, SETTINGS)
    assert (outcome.solver_correct, outcome.system_correct, outcome.accepted) == (False, True, True)
    (corrector_inputs,) = [inputs for role, inputs, _, _ in team.calls if role == "corrector"]
    assert corrector_inputs["report"] == "Wrong" and corrector_inputs["solution"] == "\\boxed{6}"
    assert (outcome.right_reviewed, outcome.right_passed) == (4, 4)
    assert (outcome.wrong_reviewed, outcome.wrong_failed) == (1, 1)


async def test_ten_failures_give_up_and_keep_the_last_candidate() -> None:
    team = ScriptedTeam(
        solver=answers("7"),
        verifier=verdicts(*["Wrong"] * 10),
        corrector=answers(*[str(i) for i in range(20)], role="corrector"),
    )
    outcome = await solve_with_review(team, PROBLEM, SETTINGS)
    assert outcome.reviews == 10 and not outcome.accepted
    assert team.count("corrector") == 9
    assert outcome.solver_correct and not outcome.system_correct


async def test_without_acceptance_the_most_passed_candidate_wins() -> None:
    # The Solver's 7 passes three times, then every correction passes at most once.
    team = ScriptedTeam(
        solver=answers("7"),
        verifier=verdicts(
            "Correct", "Correct", "Correct", "Wrong", "Correct", "Wrong", *["Wrong"] * 4
        ),
        corrector=answers("5", "4", "3", "2", "1", "0", role="corrector"),
    )
    outcome = await solve_with_review(team, PROBLEM, SETTINGS)
    assert outcome.reviews == 10 and not outcome.accepted
    assert outcome.system_correct


async def test_an_always_wrong_verifier_scores_chance_however_skewed() -> None:
    problems = [Problem(f"p{i}", "What is 3 + 4?", "7") for i in range(4)]
    solver = answers("7", "1", "2", "3")
    team = ScriptedTeam(
        solver=solver,
        verifier=verdicts(*["Wrong"] * 40),
        corrector=answers(*["1"] * 40, role="corrector"),
    )
    report = await evaluate(team, problems, EvalSettings(concurrency=1))
    assert report.solver_accuracy == 0.25
    assert report.verdict_accuracy == 0.5


async def test_mappa_is_evaluated_through_its_own_three_agents() -> None:
    team = ScriptedTeam(
        problem_solver=answers("6", role="problem_solver"),
        code_executor=iter([output("code_executor", "```python\nprint(3 + 4)\n```")]),
        final_verifier=answers("7", role="final_verifier"),
    )
    report = await evaluate(team, [PROBLEM], SETTINGS, workflow="mappa")
    assert (report.solver_accuracy, report.system_accuracy) == (0.0, 1.0)
    assert report.verdict_accuracy is None
    (final,) = [inputs for role, inputs, _, _ in team.calls if role == "final_verifier"]
    assert final["observation"].strip() == "7"


async def test_a_team_without_a_verifier_is_evaluated_by_its_solver() -> None:
    team = ScriptedTeam(solver=answers("7", "6"))
    wrong = Problem("p2", "What is 3 + 4?", "7")
    report = await evaluate(team, [PROBLEM, wrong], SETTINGS, review=False)
    assert team.count("solver") == 2 and len(team.calls) == 2
    assert report.solver_accuracy == report.system_accuracy == 0.5
    assert report.verdict_accuracy is None
