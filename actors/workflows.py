"""Workflows: which role acts next, on what, and how each action is rewarded.

A workflow is one coroutine per episode over a ``Team``: ``act`` asks the agent of a
role for a group of actions, ``emit`` hands scored actions to their learners. With
agent-specific rewards (the default) every group is emitted the moment its agent
finishes, so its segments train while later agents of the same episode still run (the
agentic pipeline parallelism of MarsRL). With the trajectory-level reward every
action waits for the episode's outcome.

MarsRL: Solver → Verifier → Corrector → Verifier → Corrector, at most
``max_agent_steps`` agent steps; each later agent takes ``select`` outputs of the
previous one (``actors.selection``) and samples a group for each; the Corrector only
takes reports that flag an error, and a passing verdict ends that branch.

MAPPA: Problem Solver → Code Executor (up to two turns, its code run in the sandbox)
→ Verifier, separate weights per agent, every action scored by the judge.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from actors.messages import AgentOutput, Problem, SamplingParams, ScoredSegment
from actors.selection import Strategy, select
from rewards.answers import is_equivalent
from rewards.judge import Judge, JudgeRequest
from rewards.marsrl import RewardMode, corrector_reward, solver_reward, verifier_reward
from rewards.sandbox import run_python


class Team(Protocol):
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
        """A group of actions of ``role`` (``group_size`` None: the run's group size;
        ``sampling`` None: the agent's own)."""
        ...

    async def emit(self, scored: list[ScoredSegment]) -> None: ...


@dataclass
class VerdictBalance:
    """Keeps the Verifier's training groups even between right and wrong solutions: a
    group about the kind that is ahead is held back from the learner, and counted. A
    weak Solver's solutions are mostly wrong, and a Verifier trained on them learns to
    say "Wrong" to everything: its reward rises while its verdicts are worth nothing,
    and once every sample says "Wrong" each group scores alike and GRPO has no signal
    left to undo it."""

    sent: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    held_back: int = 0

    def short_of(self) -> bool | None:
        """The kind of solution (right: True) the learner has had fewer groups about,
        or None when they are even."""
        if self.sent[True] == self.sent[False]:
            return None
        return self.sent[True] < self.sent[False]

    def admits(self, solution_correct: bool) -> bool:
        if self.sent[solution_correct] > self.sent[not solution_correct]:
            self.held_back += 1
            return False
        self.sent[solution_correct] += 1
        return True


@dataclass(frozen=True)
class EpisodeContext:
    """What a workflow may read besides its team and problem: the conductor's settings
    and random generator, and the judge when the run has one."""

    select: int = 2
    selection: Strategy = "adaptive"
    max_agent_steps: int = 5
    reward: RewardMode = "agent"
    executor_turns: int = 2
    rng: random.Random = field(default_factory=random.Random)
    judge: Judge | None = None
    sandbox: Callable[[str], Awaitable[str]] | None = None
    verdict_balance: VerdictBalance | None = None


Episode = Callable[[Team, Problem, EpisodeContext], Awaitable[float]]
"""A workflow: runs one episode, returns its accuracy (what the console reports)."""


@dataclass
class _Node:
    """One action in an episode's tree and what its branch came to."""

    output: AgentOutput
    correct: bool
    """Solver/Corrector: its answer is right. Verifier: its verdict is right."""
    final: bool
    """The correctness of the solution this action's branch ends with, if it ends here."""
    children: list[_Node] = field(default_factory=list)

    def outcome(self) -> float:
        """Trajectory reward: the mean final correctness over the branch's leaves."""
        if not self.children:
            return float(self.final)
        return sum(child.outcome() for child in self.children) / len(self.children)


async def marsrl_episode(team: Team, problem: Problem, settings: EpisodeContext) -> float:
    """Run one MarsRL episode; returns the fraction of its Solver outputs that were right."""
    episode = problem.problem_id
    rng = settings.rng
    trajectory = settings.reward == "trajectory"
    held: list[tuple[_Node, dict[str, float]]] = []

    async def emit(nodes: list[_Node], rewards: Sequence[tuple[float, dict[str, float]]]) -> None:
        if trajectory:
            held.extend((node, parts) for node, (_, parts) in zip(nodes, rewards, strict=True))
        else:
            await team.emit(
                [
                    ScoredSegment(node.output.segment, reward, parts)
                    for node, (reward, parts) in zip(nodes, rewards, strict=True)
                ]
            )

    async def solve(
        role: str, inputs: dict[str, str], parent: str, depth: int, into: list[_Node]
    ) -> None:
        outputs = await team.act(episode, role, inputs, parent)
        score = solver_reward if role == "solver" else corrector_reward
        rewards = [score(o.answer, problem.answer) for o in outputs]
        nodes = [_Node(o, r > 0, r > 0) for o, (r, _) in zip(outputs, rewards, strict=True)]
        into.extend(nodes)
        await emit(nodes, rewards)
        if depth + 1 >= settings.max_agent_steps:
            return
        balance = settings.verdict_balance
        chosen = select(
            nodes,
            settings.select,
            settings.selection,
            correct=lambda n: n.correct,
            preferred=lambda n: not n.correct,
            rng=rng,
            lean=balance.short_of() if balance is not None else None,
        )
        for node in chosen:
            await verify(node, inputs["problem"], depth + 1)

    async def verify(solution: _Node, text: str, depth: int) -> None:
        inputs = {"problem": text, "solution": solution.output.segment.text}
        outputs = await team.act(episode, "verifier", inputs, solution.output.segment.segment_id)
        rewards = [verifier_reward(o.segment.text, solution.correct) for o in outputs]
        nodes = [
            _Node(o, r > 0, solution.correct) for o, (r, _) in zip(outputs, rewards, strict=True)
        ]
        solution.children.extend(nodes)
        balance = settings.verdict_balance
        if balance is None or balance.admits(solution.correct):
            await emit(nodes, rewards)
        if depth + 1 >= settings.max_agent_steps:
            return
        reports = [n for n in nodes if n.output.verdict == "Wrong"]
        chosen = select(
            reports,
            settings.select,
            settings.selection,
            correct=lambda n: n.correct,
            preferred=lambda n: n.correct,
            rng=rng,
        )
        for report in chosen:
            corrector_inputs = {**inputs, "report": report.output.segment.text}
            await solve(
                "corrector",
                corrector_inputs,
                report.output.segment.segment_id,
                depth + 1,
                report.children,
            )

    roots: list[_Node] = []
    await solve("solver", {"problem": problem.text}, "", 0, roots)
    if trajectory:
        await team.emit(
            [
                ScoredSegment(node.output.segment, node.outcome(), {**parts, "outcome": 1.0})
                for node, parts in held
            ]
        )
    return sum(node.correct for node in roots) / max(len(roots), 1)


async def run_code(code: str) -> str:
    result = await run_python(code)
    return result.observation()


async def mappa_episode(team: Team, problem: Problem, settings: EpisodeContext) -> float:
    """Run one MAPPA episode; every action is scored by the judge, process reward =
    score / 10 on its last token. Returns whether the final answer was right."""
    episode = problem.problem_id
    judge = settings.judge
    if judge is None:
        raise ValueError("the mappa workflow needs a judge")
    sandbox = settings.sandbox or run_code

    async def scored(role: str, inputs: dict[str, str], output: AgentOutput, seen: str) -> None:
        verdict = await judge.score(
            JudgeRequest(
                role=role,
                input=inputs.get("solution", inputs["problem"]),
                output=output.segment.text,
                observation=seen,
                reference=problem.answer,
            )
        )
        parts = {"judge_score": verdict.score}
        await team.emit([ScoredSegment(output.segment, verdict.reward, parts)])

    (proposal, *_) = await team.act(episode, "problem_solver", {"problem": problem.text}, "")
    await scored("problem_solver", {"problem": problem.text}, proposal, "")
    inputs = {"problem": problem.text, "solution": proposal.segment.text}
    parent, observation = proposal.segment.segment_id, ""
    executor = proposal
    for _ in range(settings.executor_turns):
        (executor, *_) = await team.act(
            episode, "code_executor", {**inputs, "observation": observation}, parent
        )
        observation = await sandbox(executor.code) if executor.code else "no code was given"
        await scored("code_executor", inputs, executor, observation)
        parent = executor.segment.segment_id
        if executor.code and "Error" not in observation:
            break
    final_inputs = {
        "problem": problem.text,
        "solution": executor.segment.text,
        "observation": observation,
    }
    (final, *_) = await team.act(episode, "final_verifier", final_inputs, parent)
    await scored("final_verifier", final_inputs, final, observation)
    return float(bool(final.answer) and is_equivalent(final.answer, problem.answer))


WORKFLOWS: dict[str, Episode] = {"marsrl": marsrl_episode, "mappa": mappa_episode}


def register_workflow(name: str, episode: Episode) -> None:
    """Make ``episode`` available as ``conductor.workflow = name``."""
    if name in WORKFLOWS:
        raise ValueError(f"a workflow named {name!r} exists already")
    WORKFLOWS[name] = episode
