"""Test-time evaluation: Solver accuracy and the V-C system's accuracy side by side
(the columns of MarsRL's Table 1), on the held-out split.

The system loop follows the paper: the Solver answers once; then the Verifier reviews
the current candidate and, when it flags an error, the Corrector revises it. A
candidate is accepted after ``accept_after`` consecutive passes; the loop gives up
after ``give_up_after`` consecutive failures or ``max_iterations`` reviews, and then
falls back to the candidate the Verifier passed most often (the last one if it passed
none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import msgspec

from actors.messages import AgentOutput, Problem, SamplingParams
from actors.workflows import Team
from rewards.answers import is_equivalent


class EvalSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    accept_after: int = 4
    give_up_after: int = 10
    max_iterations: int = 10
    sampling: SamplingParams = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=16)
    concurrency: int = 8


@dataclass(frozen=True)
class ProblemOutcome:
    problem_id: str
    solver_correct: bool
    system_correct: bool
    reviews: int
    accepted: bool


@dataclass(frozen=True)
class EvalReport:
    problems: int
    solver_accuracy: float
    system_accuracy: float
    accepted: float
    """Fraction of problems whose candidate reached ``accept_after`` passes."""
    outcomes: list[ProblemOutcome]


def _right(output: AgentOutput, problem: Problem) -> bool:
    return bool(output.answer) and is_equivalent(output.answer, problem.answer)


async def solve_with_review(team: Team, problem: Problem, settings: EvalSettings) -> ProblemOutcome:
    episode = f"eval/{problem.problem_id}"

    async def one(role: str, inputs: dict[str, str], parent: str) -> AgentOutput:
        (output,) = await team.act(
            episode, role, inputs, parent, group_size=1, sampling=settings.sampling
        )
        return output

    first = await one("solver", {"problem": problem.text}, "")
    candidate = first
    passes: Counter[str] = Counter()
    candidates = {first.segment.segment_id: first}
    in_a_row = failures = reviews = 0
    accepted = False
    while reviews < settings.max_iterations:
        reviews += 1
        inputs = {"problem": problem.text, "solution": candidate.segment.text}
        report = await one("verifier", inputs, candidate.segment.segment_id)
        if report.verdict == "Correct":
            passes[candidate.segment.segment_id] += 1
            in_a_row, failures = in_a_row + 1, 0
            if in_a_row >= settings.accept_after:
                accepted = True
                break
            continue
        in_a_row, failures = 0, failures + 1
        if failures >= settings.give_up_after:
            break
        candidate = await one(
            "corrector", {**inputs, "report": report.segment.text}, report.segment.segment_id
        )
        candidates[candidate.segment.segment_id] = candidate
    if not accepted and passes:
        candidate = candidates[passes.most_common(1)[0][0]]
    return ProblemOutcome(
        problem.problem_id, _right(first, problem), _right(candidate, problem), reviews, accepted
    )


async def evaluate(team: Team, problems: Sequence[Problem], settings: EvalSettings) -> EvalReport:
    """Every problem through the Solver and the system, ``settings.concurrency`` at once."""
    outcomes: list[ProblemOutcome] = []
    limiter = anyio.CapacityLimiter(settings.concurrency)

    async def run(problem: Problem) -> None:
        async with limiter:
            outcomes.append(await solve_with_review(team, problem, settings))

    async with anyio.create_task_group() as tasks:
        for problem in problems:
            tasks.start_soon(run, problem)
    count = max(len(outcomes), 1)
    outcomes.sort(key=lambda o: o.problem_id)
    return EvalReport(
        problems=len(outcomes),
        solver_accuracy=sum(o.solver_correct for o in outcomes) / count,
        system_accuracy=sum(o.system_correct for o in outcomes) / count,
        accepted=sum(o.accepted for o in outcomes) / count,
        outcomes=outcomes,
    )
