"""The conductor runs MarsRL episodes over scripted agents: groups flow Solver →
Verifier → Corrector → Verifier → Corrector, the Corrector only sees error reports,
every group reaches the learner with agent-specific rewards the moment its agent is
done (or, with the trajectory reward, the episode's outcome at its end), and admission
control holds new problems back until the learners' versions move."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pytest
import trio
import trio.testing

from actors.conductor import (
    Conductor,
    ConductorConfig,
    ConductorStats,
    GetConductorStats,
    RunFailed,
)
from actors.messages import (
    AgentOutput,
    FlushBatch,
    GetLearnerStats,
    LearnerProgress,
    LearnerStats,
    Problem,
    ScoredSegment,
    Segment,
    Task,
    TaskResult,
)
from rewards.judge import RuleJudge
from rewards.sandbox import extract_code
from runtime import Actor, ActorRef, Node
from runtime.testing import Capture, open_cluster

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


SCRIPTS = {
    # Half the solutions right, verdicts alternate, corrections always right.
    "solver": [("\\boxed{7}", "7", ""), ("\\boxed{3}", "3", "")],
    "verifier": [("Correct", "", "Correct"), ("Wrong", "", "Wrong")],
    "corrector": [("\\boxed{7}", "7", "")],
}


class ScriptedAgent(Actor):
    """Plays a role by script: the i-th sample of a group gets script line i."""

    inbox = Task
    concurrency = 16

    def __init__(
        self, seen: list[Task], scripts: dict[str, list[tuple[str, str, str]]] = SCRIPTS
    ) -> None:
        self.seen = seen
        self.scripts = scripts

    async def handle(self, task: Task) -> TaskResult:
        self.seen.append(task)
        script = itertools.cycle(self.scripts[task.role])
        outputs = []
        for i in range(task.group_size):
            text, answer, verdict = next(script)
            sample_id = f"{task.task_id}/{i}"
            segment = Segment(
                segment_id=sample_id,
                episode_id=task.episode_id,
                sample_id=sample_id,
                parent_id=task.parent_id,
                group=task.task_id,
                group_size=task.group_size,
                role=task.role,
                policy="team",
                prompt_ids=np.array([1, 2], dtype=np.int32),
                completion_ids=np.array([3], dtype=np.int32),
                logprobs=np.array([-1.0], dtype=np.float32),
                versions=np.array([0], dtype=np.int32),
                finish_reason="stop",
                text=text,
            )
            code = extract_code(text) or ""
            outputs.append(AgentOutput(segment, answer=answer, verdict=verdict, code=code))
        return TaskResult(task.task_id, outputs)


def scored_only(messages: list[object]) -> list[ScoredSegment]:
    """What a learner was sent, less the conductor's flush requests."""
    return [m for m in messages if isinstance(m, ScoredSegment)]


def problems() -> Iterator[Problem]:
    for i in itertools.count():
        yield Problem(f"p{i}", f"What is {i} + 7 - {i}?", "7")


def learner_stand_in(at: int = 0) -> Capture:
    """Records what the learner is sent; to the conductor's question, a learner that
    has taken ``at`` steps (a resumed one, unless 0)."""

    def answer(message: object) -> LearnerStats | None:
        if not isinstance(message, GetLearnerStats):
            return None
        return LearnerStats("team", at, at, at, {}, 0, 0, 0, {}, {}, {})

    return Capture(ScoredSegment | FlushBatch | GetLearnerStats, answer=answer)


@dataclass
class Team:
    """A conductor on a head node, scripted agents on another, and a capture in the
    learner's place."""

    head: Node
    ref: ActorRef
    conductor: Conductor
    learner: Capture
    seen: list[Task]


@asynccontextmanager
async def scripted_team(
    config: ConductorConfig,
    scripts: dict[str, list[tuple[str, str, str]]] = SCRIPTS,
    *,
    learner_at: int = 0,
    agent: type[ScriptedAgent] | None = None,
    **options: Any,
) -> AsyncIterator[Team]:
    seen: list[Task] = []
    learner = learner_stand_in(learner_at)
    playing = agent or ScriptedAgent
    async with open_cluster("head", "agents") as (head, agents):
        await head.spawn("learner/team", learner.factory)
        for role in scripts:
            await agents.spawn(f"agent/{role}", lambda: playing(seen, scripts))
        conductor = Conductor(
            config,
            problems(),
            policies=dict.fromkeys(scripts, "team"),
            agents={role: f"agent/{role}" for role in scripts},
            learners={"team": "learner/team"},
            **options,
        )
        ref = await head.spawn("conductor", lambda: conductor)
        yield Team(head, ref, conductor, learner, seen)


async def one_episode(
    config: ConductorConfig,
) -> tuple[list[Task], list[ScoredSegment], ConductorStats]:
    """Run the conductor until its first episode is done; returns the tasks the agents
    saw, what reached the learner, and the conductor's statistics at that moment. The
    learner never reports a step, so admission must hold every later problem back."""
    async with scripted_team(config) as team, trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(team.conductor.run, until_batches=1))
        await trio.testing.wait_all_tasks_blocked()
        await team.learner.wait_for(2 * 13 if config.reward == "agent" else 1)
        stats = await team.head.call(team.ref, GetConductorStats(), timeout=5)
        await team.head.send(team.ref, LearnerProgress("team", 1, batches=1))
    return team.seen, scored_only(team.learner.messages), stats


CONFIG = ConductorConfig(group_size=2, select=2, max_staleness=0, problems_per_step=1)


async def test_a_marsrl_episode_unrolls_and_rewards_each_agent(autojump_clock: object) -> None:
    seen, scored, stats = await one_episode(CONFIG)
    assert Counter(t.role for t in seen) == {"solver": 1, "verifier": 6, "corrector": 6}
    assert all(t.inputs["report"] == "Wrong" for t in seen if t.role == "corrector")
    assert (stats.started, stats.finished, stats.waiting_for_learners) == (1, 1, True)
    by_id = {s.segment.segment_id: s for s in scored}
    assert len(by_id) == 26
    groups = Counter(s.segment.group for s in scored)
    assert set(groups.values()) == {2}
    rewards: dict[str, list[float]] = {}
    for s in scored:
        rewards.setdefault(s.segment.role, []).append(s.reward)
    assert sorted(rewards["solver"]) == [0.0, 1.0]
    assert rewards["corrector"] == [1.0] * 12
    assert sum(rewards["verifier"]) == 6.0
    for s in scored:
        parent = by_id.get(s.segment.parent_id)
        if s.segment.role == "solver":
            assert s.segment.parent_id == ""
        elif s.segment.role == "corrector":
            assert parent is not None and parent.segment.text == "Wrong"
        else:
            assert parent is not None and parent.segment.role in ("solver", "corrector")
    for s in scored:
        if s.segment.role == "verifier":
            judged = by_id[s.segment.parent_id]
            agrees = (judged.reward == 1.0) == (s.segment.text == "Correct")
            assert s.reward == float(agrees)


async def test_trajectory_rewards_give_every_action_its_branch_outcome(
    autojump_clock: object,
) -> None:
    _, scored, _ = await one_episode(msgspec.structs.replace(CONFIG, reward="trajectory"))
    assert len(scored) == 26
    solver = sorted(s.reward for s in scored if s.segment.role == "solver")
    assert solver == [0.5, 1.0]
    assert all(s.parts.get("outcome") == 1.0 for s in scored)


@pytest.mark.parametrize("resumed_at", [0, 40])
async def test_admission_follows_the_learners_and_run_ends_at_the_target(
    autojump_clock: object, resumed_at: int
) -> None:
    """Each batch the learner reports consuming lets one more problem start
    (max_staleness 0, one problem a batch), also a batch skipped without a new version;
    ``run`` returns once the learner reports the target number of batches. A resumed
    run's learner starts where its checkpoint was, and admission counts from there."""
    async with scripted_team(CONFIG, learner_at=resumed_at) as team:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                until = resumed_at + 5
                nursery.start_soon(functools.partial(team.conductor.run, until_batches=until))
                versions = [0, 1, 1, 2, 3, 4]
                for batches, (before, version) in enumerate(itertools.pairwise(versions), 1):
                    await trio.testing.wait_all_tasks_blocked()
                    assert (team.conductor.started, team.conductor.finished) == (batches, batches)
                    assert team.conductor.versions["team"] == resumed_at + before
                    progress = LearnerProgress(
                        "team", resumed_at + version, batches=resumed_at + batches
                    )
                    await team.head.send(team.ref, progress)
    assert len({t.episode_id for t in team.seen}) == 5


MAPPA_SCRIPTS = {
    "problem_solver": [("Add them: \\boxed{7}", "7", "")],
    "code_executor": [("```python\nprint(3 + 4)\n```", "", "")],
    "final_verifier": [("\\boxed{7}", "7", "")],
}


async def test_a_mappa_episode_scores_every_action_with_the_judge(autojump_clock: object) -> None:
    """Solver, then the executor's code through the sandbox (its output is what the
    verifier and the judge see), then the verifier; each action scored by the judge."""
    ran: list[str] = []

    async def sandbox(code: str) -> str:
        ran.append(code)
        return "7\n"

    config = ConductorConfig(workflow="mappa", group_size=1, problems_per_step=1, max_staleness=0)
    options = {"judge": RuleJudge(), "sandbox": sandbox}
    async with (
        scripted_team(config, MAPPA_SCRIPTS, **options) as team,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(functools.partial(team.conductor.run, until_batches=1))
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    seen = team.seen
    first = [s for s in scored_only(team.learner.messages) if s.segment.episode_id == "p0"]
    assert [s.segment.role for s in first] == ["problem_solver", "code_executor", "final_verifier"]
    assert ran == ["print(3 + 4)\n"]
    assert [t.inputs.get("observation", "") for t in seen if t.role == "final_verifier"] == ["7\n"]
    assert [s.reward for s in first] == [1.0, 1.0, 1.0]
    assert all(s.parts["judge_score"] == 10.0 for s in first)


async def test_when_flushed_learners_hold_nothing_a_new_problem_starts(
    autojump_clock: object,
) -> None:
    """Nothing runs, admission waits for a batch, and the learner answers the flush
    with nothing trained: only new data can fill its batch, so the conductor starts the
    next problem instead of waiting for ever."""
    async with scripted_team(CONFIG) as team:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(team.conductor.run, until_batches=1))
                await trio.testing.wait_all_tasks_blocked()
                assert (team.conductor.started, team.conductor.finished) == (1, 1)
                assert team.learner.messages[-1] == FlushBatch("team")
                await team.head.send(team.ref, LearnerProgress("team", 0, flushed=True))
                await team.learner.wait_for(1 + 2 * 26)
                assert team.conductor.started >= 2
                await team.head.send(team.ref, LearnerProgress("team", 1, batches=1))
    episodes = {s.segment.episode_id for s in scored_only(team.learner.messages)}
    assert {"p0", "p1"} <= episodes


class HeldSolver(ScriptedAgent):
    """Answers the first episode's Solver task, and holds every later one until
    ``release`` is set."""

    release = trio.Event()

    async def handle(self, task: Task) -> TaskResult:
        if task.role == "solver" and task.episode_id != "p0":
            await self.release.wait()
        return await super().handle(task)


async def test_starved_learners_get_max_in_flight_episodes_at_once(autojump_clock: object) -> None:
    """The flushed learner holds nothing and still waits for a batch: its batch needs
    more problems than the staleness budget allows. Starting them one at a time ran the
    pipeline serially; the budget is lifted until the learner moves, so ``max_in_flight``
    episodes run at once, and once it moves the budget holds again."""
    HeldSolver.release = trio.Event()
    config = msgspec.structs.replace(CONFIG, max_in_flight=3)
    async with scripted_team(config, agent=HeldSolver) as team:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(team.conductor.run, until_batches=2))
                await trio.testing.wait_all_tasks_blocked()
                assert team.learner.messages[-1] == FlushBatch("team")
                await team.head.send(team.ref, LearnerProgress("team", 0, flushed=True))
                await trio.testing.wait_all_tasks_blocked()
                assert (team.conductor.started, team.conductor.finished) == (4, 1)
                await team.head.send(team.ref, LearnerProgress("team", 1, batches=1))
                HeldSolver.release.set()
                await trio.testing.wait_all_tasks_blocked()
                # Budget (0 + 1 + 1) * 1 = 2 problems: none starts until the learner
                # is starved again or moves.
                assert team.conductor.started == team.conductor.finished == 4
                await team.head.send(team.ref, LearnerProgress("team", 2, batches=2))


async def test_balanced_verdicts_train_the_verifier_on_right_and_wrong_solutions_alike(
    autojump_clock: object,
) -> None:
    """The script's Corrector is always right, so most solutions the Verifier reviews
    are right; with ``balance_verdicts`` the learner gets its groups about right and
    wrong solutions in equal numbers (one more of a kind at most), and the groups held
    back are counted."""
    config = msgspec.structs.replace(CONFIG, balance_verdicts=True)
    async with scripted_team(config) as team:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(team.conductor.run, until_batches=1))
                await trio.testing.wait_all_tasks_blocked()
                assert team.learner.messages[-1] == FlushBatch("team")
                stats = await team.head.call(team.ref, GetConductorStats(), timeout=5)
                await team.head.send(team.ref, LearnerProgress("team", 1, batches=1))
    scored = scored_only(team.learner.messages)
    by_id = {s.segment.segment_id: s for s in scored}
    reviewed: Counter[bool] = Counter()
    for group in {s.segment.group: s for s in scored if s.segment.role == "verifier"}.values():
        reviewed[by_id[group.segment.parent_id].reward == 1.0] += 1
    assert reviewed[True] >= 1 and abs(reviewed[True] - reviewed[False]) <= 1
    verifier_tasks = sum(t.role == "verifier" for t in team.seen)
    assert stats.verdicts_held_back == verifier_tasks - sum(reviewed.values()) > 0
    assert Counter(s.segment.role for s in scored)["corrector"] == 12


class RefusingAgent(Actor):
    inbox = Task

    async def handle(self, task: Task) -> TaskResult:
        raise ValueError(f"prompt of task {task.task_id} is too long for the model")


async def test_a_run_whose_episodes_all_fail_stops_with_the_last_error(
    autojump_clock: object,
) -> None:
    """Admission starts a new episode whenever nothing is in flight, so an agent that
    refuses everything would have the run start and fail episodes for ever."""
    config = ConductorConfig(max_failures_in_a_row=5, max_in_flight=2)
    async with open_cluster("head", "agents") as (head, agents):
        await head.spawn("learner/team", learner_stand_in().factory)
        await agents.spawn("agent/solver", RefusingAgent)
        conductor = Conductor(
            config,
            problems(),
            policies={"solver": "team"},
            agents={"solver": "agent/solver"},
            learners={"team": "learner/team"},
        )
        await head.spawn("conductor", lambda: conductor)
        with pytest.raises(
            RunFailed, match=r"[56] episodes in a row failed.*too long for the model"
        ):
            await conductor.run(until_batches=1)
    assert 5 <= conductor.failed <= 6


class RestartingAgent(ScriptedAgent):
    """Fails every task for its first second, as an agent does while its engine's
    process is started again, then plays its script."""

    def __init__(self, seen: list[Task]) -> None:
        super().__init__(seen)
        self.serving_at = trio.current_time() + 1.0

    async def handle(self, task: Task) -> TaskResult:
        if trio.current_time() < self.serving_at:
            raise ValueError("engine/team/0 is down")
        return await super().handle(task)


async def test_admission_backs_off_while_episodes_fail_so_a_restart_is_waited_out(
    autojump_clock: object,
) -> None:
    """Five failures in a row would stop the run; paused 0.1, 0.2, 0.4 and 0.8 s
    after the first four, admission starts the fifth episode past the agent's 1 s
    outage."""
    config = ConductorConfig(max_failures_in_a_row=5, max_in_flight=1, group_size=1)
    seen: list[Task] = []
    async with open_cluster("head", "agents") as (head, agents):
        learner = learner_stand_in()
        await head.spawn("learner/team", learner.factory)
        await agents.spawn("agent/solver", lambda: RestartingAgent(seen))
        for role in ("verifier", "corrector"):
            await agents.spawn(f"agent/{role}", lambda: ScriptedAgent(seen))
        conductor = Conductor(
            config,
            problems(),
            policies=dict.fromkeys(SCRIPTS, "team"),
            agents={role: f"agent/{role}" for role in SCRIPTS},
            learners={"team": "learner/team"},
        )
        ref = await head.spawn("conductor", lambda: conductor)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(conductor.run, until_batches=1))
            await learner.wait_for(1)
            await head.send(ref, LearnerProgress("team", 1, batches=1))
    assert conductor.failed == 4 and seen
