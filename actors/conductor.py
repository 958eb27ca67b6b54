"""The conductor: starts episodes, routes each finished group to the next role and its
scored actions to their learners, and keeps the whole pipeline within the staleness
budget.

Admission control is AReaL's rule: a new problem starts only while
``started < (max_staleness + batches + 1) * problems_per_step``, where ``batches`` is
the fewest batches any learner has consumed (they report every batch with
``LearnerProgress``; a batch whose groups all had equal rewards is consumed without
making a version, and counting versions would stall admission on it). So
backpressure stops work from being *started*; nothing that finished is thrown away.
``max_in_flight`` bounds the episodes running at once. When every admitted episode has
finished and admission still waits, the data sent cannot fill the learners' next
batch: the conductor asks them to train on the complete groups they hold
(``FlushBatch``), which moves ``batches`` on. If even that leaves a learner short (its
batch needs more problems than ``problems_per_step``: the Verifier's, when its classes
are balanced and right solutions are rare), the learners are starved rather than
behind, and admission lifts the staleness clause until the fewest batches moves: every
episode started then runs at the learners' current versions, so it adds no staleness,
while the pipeline runs ``max_in_flight`` episodes rather than one at a time.

The conductor is an actor (its inbox takes the learners' progress and statistics
requests) and is driven by ``run``, which the launcher awaits on the head node.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator

import anyio
import msgspec

from actors.ledger import LedgerWriter
from actors.messages import (
    AgentOutput,
    FlushBatch,
    GetLearnerStats,
    LearnerProgress,
    Problem,
    SamplingParams,
    ScoredSegment,
    Task,
)
from actors.selection import Strategy
from actors.workflows import WORKFLOWS, EpisodeContext, VerdictBalance
from rewards.judge import Judge
from rewards.marsrl import RewardMode
from runtime import Actor, ActorRef, Message, Request


class ConductorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    workflow: str = "marsrl"
    """A name in ``actors.workflows.WORKFLOWS``."""
    group_size: int = 4
    select: int = 2
    selection: Strategy = "adaptive"
    max_agent_steps: int = 5
    reward: RewardMode = "agent"
    executor_turns: int = 2
    balance_verdicts: bool = False
    """Train the Verifier on as many groups about right solutions as about wrong ones
    (``actors.workflows.VerdictBalance``)."""
    max_staleness: int = 2
    problems_per_step: int = 4
    """About the problems one learner batch takes: ``groups_per_batch`` over the groups
    a problem makes for that learner. Set too low, admission waits and the learners
    are flushed into small batches."""
    max_in_flight: int = 8
    task_timeout: float = 600.0
    max_failures_in_a_row: int = 64
    """The run stops with an error after this many episodes failed one after another:
    an engine refusing every request (a prompt too long for the model, a dead engine)
    would otherwise have admission start and fail episodes for ever."""
    failure_backoff: float = 0.1
    """Seconds admission pauses after an episode failed, doubling with each failure in
    a row up to ``failure_backoff_max``: a node process being started again (an engine
    takes seconds to load) fails every episode meanwhile, and without the pause the
    run would spend ``max_failures_in_a_row`` on it within a second."""
    failure_backoff_max: float = 5.0
    """The longest pause: a dead engine stops the run after ``max_failures_in_a_row``
    failures in a few minutes at the defaults, not at once."""


class RoleStats(Message, frozen=True):
    actions: int
    """Actions sent to their learner."""
    reward_mean: float
    """Over the last 256 actions."""
    actions_per_s: float
    queued: int
    """Groups asked of this role's agent and not answered yet: its queue depth."""
    staleness_mean: float
    """Over the last 256 actions: the policy's version when the action was sent to its
    learner, less the oldest version that generated it."""


class RunFailed(RuntimeError):
    """Episodes keep failing: the run cannot make progress. The message carries the
    last episode's error."""


class ConductorStats(Message, frozen=True):
    started: int
    finished: int
    failed: int
    """Episodes an agent call failed in (logged with the error); their scored actions
    were emitted already."""
    in_flight: int
    versions: dict[str, int]
    batches: dict[str, int]
    roles: dict[str, RoleStats]
    solver_accuracy: float
    """Solver outputs right, over the last 64 episodes."""
    waiting_for_learners: bool
    verdicts_held_back: int = 0
    """Verifier groups kept from the learner to balance its classes (``balance_verdicts``)."""


class GetConductorStats(Request[ConductorStats], frozen=True):
    pass


class Conductor(Actor):
    inbox = LearnerProgress | GetConductorStats
    mailbox_size = 256
    concurrency = 4

    def __init__(
        self,
        config: ConductorConfig,
        problems: Iterator[Problem],
        *,
        policies: dict[str, str],
        agents: dict[str, str],
        learners: dict[str, str],
        judge: Judge | None = None,
        on_scored: Callable[[ScoredSegment], None] | None = None,
        sandbox: Callable[[str], Awaitable[str]] | None = None,
        seed: int = 0,
        ledger: LedgerWriter | None = None,
        again: dict[str, str] | None = None,
    ) -> None:
        """``policies`` maps each role to its policy, ``agents`` each role to its agent
        actor, ``learners`` each policy to its learner actor; ``on_scored`` sees every
        scored action on its way to the learner (the launcher samples texts with it);
        ``sandbox`` runs an executor's code (default: ``rewards.sandbox``); ``seed``
        seeds the selections. ``ledger`` records each problem admitted and how its
        episode ended; ``again`` maps the ids of problems a killed run left unfinished,
        admitted again under a new id, to their old ids (``actors.ledger``)."""
        self.on_scored = on_scored
        self.ledger = ledger
        self.again = again or {}
        self.config = config
        self.problems = problems
        self.policies = policies
        self.agent_names = agents
        self.learner_names = learners
        self.judge = judge
        self.versions = dict.fromkeys(learners, 0)
        self.batches = dict.fromkeys(learners, 0)
        self._flushed: dict[str, int] = {}
        self._flush_pending: set[str] = set()
        self.started = self.finished = 0
        self._agents: dict[str, ActorRef] = {}
        self._learners: dict[str, ActorRef] = {}
        self._changed = anyio.Event()
        self._tasks = itertools.count()
        self._rewards: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=256))
        self._staleness: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=256))
        self._queued: dict[str, int] = defaultdict(int)
        self._actions: dict[str, int] = defaultdict(int)
        self._accuracy: deque[float] = deque(maxlen=64)
        self._waiting = False
        self._starved_at: int | None = None
        """The fewest batches when the learners were last found starved: until it moves,
        the staleness clause of admission is lifted."""
        self._began = time.monotonic()
        self._batches_at_start = 0
        """Where the learners stood when ``run`` began (a resumed run's checkpoint):
        admission counts the batches since, as it counts the problems it started."""
        self.failed = 0
        self._failures_in_a_row = 0
        self._last_failure = ""
        workflow = WORKFLOWS.get(config.workflow)
        if workflow is None:
            raise ValueError(
                f"conductor.workflow {config.workflow!r} is not one of {sorted(WORKFLOWS)}"
            )
        self._workflow = workflow
        self._context = EpisodeContext(
            select=config.select,
            selection=config.selection,
            max_agent_steps=config.max_agent_steps,
            reward=config.reward,
            executor_turns=config.executor_turns,
            rng=random.Random(seed),
            judge=judge,
            sandbox=sandbox,
            verdict_balance=VerdictBalance() if config.balance_verdicts else None,
        )

    async def handle(self, message: LearnerProgress | GetConductorStats) -> ConductorStats | None:
        if isinstance(message, GetConductorStats):
            return self.statistics()
        policy = message.policy
        answered = message.flushed and policy in self._flush_pending
        if answered:
            self._flush_pending.discard(policy)
        if (
            answered
            or message.version > self.versions.get(policy, 0)
            or message.batches > self.batches.get(policy, 0)
        ):
            self.versions[policy] = max(message.version, self.versions.get(policy, 0))
            self.batches[policy] = max(message.batches, self.batches.get(policy, 0))
            self._announce_change()
        return None

    @property
    def version(self) -> int:
        return min(self.versions.values(), default=0)

    async def run(self, *, until_batches: int) -> None:
        """Start episodes until every learner has consumed ``until_batches`` batches
        (steps, and batches skipped for equal rewards: counting steps alone, a learner
        whose every group scores alike would keep the run going for ever); episodes still
        running then are cancelled."""
        await self.connect()
        self._began = time.monotonic()
        self._batches_at_start = min(self.batches.values(), default=0)
        if self.ledger is not None:
            self.ledger.write("launch", steps=until_batches)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._admit, tasks)
            await self.wait_for_batches(until_batches)
            tasks.cancel_scope.cancel()
        if self._failing:
            raise RunFailed(
                f"{self._failures_in_a_row} episodes in a row failed (conductor."
                f"max_failures_in_a_row is {self.config.max_failures_in_a_row}); the last: "
                f"{self._last_failure}"
            )

    async def wait_for_batches(self, count: int) -> None:
        """Return once every learner consumed ``count`` batches (or the run is failing)."""
        while min(self.batches.values(), default=0) < count and not self._failing:
            await self._wait_for_change()

    @property
    def _failing(self) -> bool:
        return self._failures_in_a_row >= self.config.max_failures_in_a_row

    async def connect(self) -> None:
        """Look the agents and learners up, and read each learner's version and batches:
        those of a resumed run start from its checkpoint (``run`` does this first)."""
        timeout = self.config.task_timeout
        for role, name in self.agent_names.items():
            self._agents[role] = await self.lookup(name, timeout=timeout)
        for policy, name in self.learner_names.items():
            ref = self._learners[policy] = await self.lookup(name, timeout=timeout)
            stats = await self.call(ref, GetLearnerStats(), timeout=timeout)
            self.versions[policy] = max(self.versions[policy], stats.version)
            batches = stats.steps + stats.skipped_batches
            self.batches[policy] = max(self.batches[policy], batches)

    async def _admit(self, tasks: anyio.abc.TaskGroup) -> None:
        config = self.config
        for problem in self.problems:
            while self._stale() or self.started - self.finished >= config.max_in_flight:
                self._waiting = True
                if self.started == self.finished:
                    await self._flush_learners()
                    if not self._flush_pending:
                        # Every learner has trained on all it holds and still waits for
                        # a batch: only new episodes can fill it.
                        self._starved_at = self._batches_since_start
                        continue
                await self._wait_for_change()
            self._waiting = False
            if self._failures_in_a_row:
                await anyio.sleep(self._backoff())
            self.started += 1
            if self.ledger is not None:
                again = self.again.get(problem.problem_id)
                self.ledger.write(
                    "admitted",
                    problem=problem.problem_id,
                    again=again,
                    input=msgspec.to_builtins(problem),
                )
            tasks.start_soon(self._episode, problem)

    def _stale(self) -> bool:
        """Admission's staleness clause: starting one more problem would exceed the
        budget (lifted while the learners are starved)."""
        batches = self._batches_since_start
        if self._starved_at == batches:
            return False
        budget = (self.config.max_staleness + batches + 1) * self.config.problems_per_step
        return self.started >= budget

    def _backoff(self) -> float:
        config = self.config
        doublings = min(self._failures_in_a_row - 1, 32)
        return min(config.failure_backoff * 2.0**doublings, config.failure_backoff_max)

    @property
    def _batches_since_start(self) -> int:
        return min(self.batches.values(), default=0) - self._batches_at_start

    async def _flush_learners(self) -> None:
        """Nothing runs and admission waits for a batch: the data already sent cannot
        fill one. Ask each learner that has moved since its last such request to train
        on the complete groups it holds; each answer clears it from the pending set."""
        for policy, ref in self._learners.items():
            if self._flushed.get(policy) == self.batches[policy]:
                continue
            self._flushed[policy] = self.batches[policy]
            self._flush_pending.add(policy)
            self.node.log.info("learners_flushed", policy=policy, started=self.started)
            await self.send(ref, FlushBatch(policy))

    async def _wait_for_change(self) -> None:
        """Wait for the next version or finished episode. Only ``_announce_change``
        replaces the event, so every waiter (the admission loop and ``run``) wakes."""
        await self._changed.wait()

    def _announce_change(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _episode(self, problem: Problem) -> None:
        ended = "cancelled"  # unless it finishes or fails: the run reached its target
        try:
            accuracy = await self._workflow(self, problem, self._context)
            self._accuracy.append(accuracy)
            self._failures_in_a_row = 0
            ended = "finished"
        except Exception as error:
            ended = "failed"
            self.failed += 1
            self._failures_in_a_row += 1
            self._last_failure = repr(error)
            self.node.log.error("episode_failed", problem=problem.problem_id, error=repr(error))
        finally:
            self.finished += 1
            if self.ledger is not None:
                self.ledger.write("ended", problem=problem.problem_id, how=ended)
            self._announce_change()

    # -- the Team interface the workflows use ---------------------------------------------

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
        task = Task(
            task_id=f"{episode}/{role}{next(self._tasks)}",
            episode_id=episode,
            role=role,
            inputs=inputs,
            group_size=group_size or self.config.group_size,
            parent_id=parent_id,
            sampling=sampling,
        )
        self._queued[role] += 1
        try:
            result = await self.call(self._agents[role], task, timeout=self.config.task_timeout)
        finally:
            self._queued[role] -= 1
        return result.outputs

    async def emit(self, scored: list[ScoredSegment]) -> None:
        """Send each scored action to its policy's learner; waits for the learner's
        credit, which is the pipeline's backpressure."""
        for item in scored:
            role = item.segment.role
            self._rewards[role].append(item.reward)
            versions = item.segment.versions
            if len(versions):
                behind = self.versions.get(item.segment.policy, 0) - int(versions.min())
                self._staleness[role].append(behind)
            if self.on_scored is not None:
                self.on_scored(item)
            await self.send(self._learners[item.segment.policy], item)
            self._actions[role] += 1  # counted once sent: a run's end may cancel the send

    def statistics(self) -> ConductorStats:
        elapsed = max(time.monotonic() - self._began, 1e-9)
        roles = {
            role: RoleStats(
                actions=self._actions[role],
                reward_mean=sum(rewards) / max(len(rewards), 1),
                actions_per_s=self._actions[role] / elapsed,
                queued=self._queued[role],
                staleness_mean=sum(self._staleness[role]) / max(len(self._staleness[role]), 1),
            )
            for role, rewards in self._rewards.items()
        }
        return ConductorStats(
            started=self.started,
            finished=self.finished,
            failed=self.failed,
            in_flight=self.started - self.finished,
            versions=dict(self.versions),
            batches=dict(self.batches),
            roles=roles,
            solver_accuracy=sum(self._accuracy) / max(len(self._accuracy), 1),
            waiting_for_learners=self._waiting,
            verdicts_held_back=(
                self._context.verdict_balance.held_back if self._context.verdict_balance else 0
            ),
        )

    def __repr__(self) -> str:
        return (
            f"<Conductor [started {self.started} | in flight {self.started - self.finished} | "
            f"versions {self.versions}]>"
        )
