"""Test-time evaluation: Solver accuracy and the V-C system's accuracy side by side
(the columns of MarsRL's Table 1), on the held-out split.

The system loop follows the paper: the Solver answers once; then the Verifier reviews
the current candidate and, when it flags an error, the Corrector revises it. A
candidate is accepted after ``accept_after`` consecutive passes; the loop gives up
after ``give_up_after`` consecutive failures or ``max_iterations`` reviews, and then
falls back to the candidate the Verifier passed most often (the last one if it passed
none).

A MAPPA team is evaluated by its own pipeline, once per problem with one sample per
step: the Problem Solver's answer is the "Solver" column and the final Verifier's the
"system" one; it has no verdicts to score.

The Verifier's own accuracy is reported balanced (the mean of its accuracy on right
and on wrong candidates), so chance is 0.5 however skewed the candidates are: a
Verifier that always says "Wrong" scores 0.5, not the fraction of wrong candidates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import msgspec

from actors.messages import AgentOutput, Problem, SamplingParams, ScoredSegment
from actors.workflows import EpisodeContext, Team, mappa_episode
from rewards.answers import is_equivalent
from rewards.judge import RuleJudge


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
    right_passed: int = 0
    """Reviews of a right candidate that said Correct."""
    right_reviewed: int = 0
    wrong_failed: int = 0
    """Reviews of a wrong candidate that said Wrong."""
    wrong_reviewed: int = 0


@dataclass(frozen=True)
class EvalReport:
    problems: int
    solver_accuracy: float
    system_accuracy: float
    accepted: float
    """Fraction of problems whose candidate reached ``accept_after`` passes."""
    verdict_accuracy: float | None
    """Balanced: chance is 0.5. None when the team has no Verifier verdicts."""
    outcomes: list[ProblemOutcome]


def _right(output: AgentOutput, problem: Problem) -> bool:
    return bool(output.answer) and is_equivalent(output.answer, problem.answer)


class _EvalTeam:
    """A team as evaluation uses it: one sample per step at the evaluation's sampling,
    nothing sent to a learner, each role's first output kept."""

    def __init__(self, team: Team, sampling: SamplingParams) -> None:
        self.team = team
        self.sampling = sampling
        self.first: dict[str, AgentOutput] = {}

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
        outputs = await self.team.act(
            f"eval/{episode}", role, inputs, parent_id, group_size=1, sampling=self.sampling
        )
        self.first.setdefault(role, outputs[0])
        return outputs

    async def emit(self, scored: list[ScoredSegment]) -> None:
        return None


async def solve_with_review(team: Team, problem: Problem, settings: EvalSettings) -> ProblemOutcome:
    evaluating = _EvalTeam(team, settings.sampling)

    async def one(role: str, inputs: dict[str, str], parent: str) -> AgentOutput:
        (output,) = await evaluating.act(problem.problem_id, role, inputs, parent)
        return output

    first = await one("solver", {"problem": problem.text}, "")
    candidate = first
    passes: Counter[str] = Counter()
    candidates = {first.segment.segment_id: first}
    in_a_row = failures = reviews = 0
    accepted = False
    tally: Counter[str] = Counter()
    while reviews < settings.max_iterations:
        reviews += 1
        inputs = {"problem": problem.text, "solution": candidate.segment.text}
        report = await one("verifier", inputs, candidate.segment.segment_id)
        if _right(candidate, problem):
            tally["right_reviewed"] += 1
            tally["right_passed"] += report.verdict == "Correct"
        else:
            tally["wrong_reviewed"] += 1
            tally["wrong_failed"] += report.verdict != "Correct"
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
        problem.problem_id,
        _right(first, problem),
        _right(candidate, problem),
        reviews,
        accepted,
        **{key: tally[key] for key in _TALLY},
    )


async def solve_alone(team: Team, problem: Problem, settings: EvalSettings) -> ProblemOutcome:
    """A team without a Verifier: the system's answer is the Solver's."""
    evaluating = _EvalTeam(team, settings.sampling)
    (first,) = await evaluating.act(problem.problem_id, "solver", {"problem": problem.text}, "")
    right = _right(first, problem)
    return ProblemOutcome(problem.problem_id, right, right, reviews=0, accepted=False)


_TALLY = ("right_passed", "right_reviewed", "wrong_failed", "wrong_reviewed")


def balanced_verdict_accuracy(outcomes: Sequence[ProblemOutcome]) -> float | None:
    """The mean of the Verifier's accuracy on right and on wrong candidates, over the
    classes it saw (None when it saw neither)."""
    rates = []
    right = sum(o.right_reviewed for o in outcomes)
    wrong = sum(o.wrong_reviewed for o in outcomes)
    if right:
        rates.append(sum(o.right_passed for o in outcomes) / right)
    if wrong:
        rates.append(sum(o.wrong_failed for o in outcomes) / wrong)
    return sum(rates) / len(rates) if rates else None


async def solve_as_mappa(
    team: Team, problem: Problem, settings: EvalSettings, executor_turns: int = 2
) -> ProblemOutcome:
    """One pass of MAPPA's Problem Solver → Code Executor → Verifier. The workflow's
    judge scores are thrown away, so the rule judge (no model) stands in for any."""
    recording = _EvalTeam(team, settings.sampling)
    context = EpisodeContext(executor_turns=executor_turns, judge=RuleJudge())
    system = await mappa_episode(recording, problem, context)
    proposal = recording.first["problem_solver"]
    return ProblemOutcome(
        problem.problem_id, _right(proposal, problem), bool(system), reviews=0, accepted=False
    )


async def evaluate(
    team: Team,
    problems: Sequence[Problem],
    settings: EvalSettings,
    *,
    workflow: str = "marsrl",
    executor_turns: int = 2,
    review: bool = True,
) -> EvalReport:
    """Every problem through the Solver and the system, ``settings.concurrency`` at once
    (``workflow`` "mappa": through MAPPA's three agents; ``review`` False: a team with
    no Verifier, whose system is its Solver)."""
    outcomes: list[ProblemOutcome] = []
    limiter = anyio.CapacityLimiter(settings.concurrency)

    async def run(problem: Problem) -> None:
        async with limiter:
            if workflow == "mappa":
                outcome = await solve_as_mappa(team, problem, settings, executor_turns)
            elif review:
                outcome = await solve_with_review(team, problem, settings)
            else:
                outcome = await solve_alone(team, problem, settings)
            outcomes.append(outcome)

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
        verdict_accuracy=balanced_verdict_accuracy(outcomes),
        outcomes=outcomes,
    )
