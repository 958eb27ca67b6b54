"""The agent actor: one role of a team, played on one policy's engines.

It answers a ``Task`` with a group of actions: it renders the role's prompt from the
task's inputs, asks an engine of its policy for ``group_size`` samples in one request
(the engine samples them together), reads each with the role's parser and returns them
as ``Segment``s ready for the reward stage. It holds no episode state; the conductor
does. Several engines of a policy are used in turn.
"""

from __future__ import annotations

import itertools

import msgspec

from actors.messages import AgentOutput, Generate, SamplingParams, Segment, Task, TaskResult
from actors.roles import role_named
from runtime import Actor, ActorRef


class AgentActor(Actor):
    inbox = Task
    mailbox_size = 256
    concurrency = 64

    def __init__(
        self,
        role: str,
        policy: str,
        engines: list[str],
        *,
        sampling: SamplingParams,
        timeout: float = 600.0,
    ) -> None:
        if not engines:
            raise ValueError(f"agent {role!r} needs at least one engine of policy {policy!r}")
        self.role = role_named(role)
        self.policy = policy
        self.engine_names = engines
        self.sampling = sampling
        self.timeout = timeout
        self._engines: list[ActorRef] = []
        self._turn = itertools.count()

    async def on_start(self) -> None:
        self._engines = [await self.lookup(n, timeout=self.timeout) for n in self.engine_names]

    async def handle(self, task: Task) -> TaskResult:
        role = self.role
        if task.role != role.name:
            raise ValueError(f"Task.role is {task.role!r}; this agent plays {role.name!r}")
        missing = [name for name in role.inputs if name not in task.inputs]
        if missing:
            raise ValueError(f"Task.inputs lacks {missing} for role {role.name!r}")
        sampling = msgspec.structs.replace(task.sampling or self.sampling, n=task.group_size)
        engine = self._engines[next(self._turn) % len(self._engines)]
        request = Generate(task.task_id, sampling, chat=role.render(task.inputs))
        generation = await self.call(engine, request, timeout=self.timeout)
        outputs = []
        for sample in generation.samples:
            sample_id = f"{task.task_id}/{sample.index}"
            parsed = role.parse(sample.text)
            segment = Segment(
                segment_id=sample_id,
                episode_id=task.episode_id,
                sample_id=sample_id,
                parent_id=task.parent_id,
                group=task.task_id,
                group_size=task.group_size,
                role=role.name,
                policy=self.policy,
                prompt_ids=sample.prompt_ids,
                completion_ids=sample.completion_ids,
                logprobs=sample.logprobs,
                versions=sample.versions,
                finish_reason=sample.finish_reason,
                text=sample.text,
                observation=task.inputs.get("observation", ""),
                timings=sample.timings,
                sampling=sampling,
            )
            outputs.append(AgentOutput(segment, parsed.answer, parsed.verdict, parsed.code))
        return TaskResult(task.task_id, outputs)
