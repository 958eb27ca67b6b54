"""The learner actor: one per policy, fed scored segments by every role that policy
plays, stepping as soon as a batch is complete and publishing weights to the policy's
engines every ``sync_every`` steps.

Training runs in a worker thread inside the handler, so while a step runs the
learner's mailbox fills and senders wait for credit: the pipeline's backpressure. A
refused segment is logged with its reason and counted; it never stops the learner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from actors.engines.weights import to_buckets
from actors.messages import GetLearnerStats, LearnerStats, ScoredSegment, WeightBucket
from learner.checkpoints import latest_checkpoint, read_checkpoint, write_checkpoint
from learner.trainer import LearnerConfig, Rejected, Trainer
from runtime import Actor, ActorRef


class LearnerActor(Actor):
    inbox = ScoredSegment | GetLearnerStats
    mailbox_size = 256

    def __init__(self, model: Any, config: LearnerConfig) -> None:
        self.config = config
        self.trainer = Trainer(model, config)
        self.published = 0
        self.applied: dict[str, int] = {}

    async def on_start(self) -> None:
        if self.config.checkpoint_dir:
            latest = latest_checkpoint(self.config.checkpoint_dir)
            if latest is not None:
                trainer = self.trainer
                state = read_checkpoint(latest, model=trainer.model, optimizer=trainer.optimizer)
                trainer.version, trainer.steps = state.version, state.step
                trainer.consumed = set(state.consumed)
                self.node.log.info("learner_resumed", checkpoint=str(latest), version=state.version)

    async def handle(self, message: ScoredSegment | GetLearnerStats) -> LearnerStats | None:
        if isinstance(message, GetLearnerStats):
            return self.statistics()
        try:
            batch = self.trainer.admit(message)
        except Rejected as refused:
            self.trainer.rejected[refused.reason] += 1
            self.node.log.warning(
                "segment_rejected",
                learner=self.name,
                reason=refused.reason,
                detail=refused.detail,
            )
            return None
        if batch is None:
            return None
        metrics = await anyio.to_thread.run_sync(self.trainer.train, batch)
        self.node.log.info(
            "learner_step", learner=self.name, version=self.trainer.version, **metrics
        )
        if self.config.engines and self.trainer.steps % self.config.sync_every == 0:
            await self.publish()
        every = self.config.checkpoint_every
        if self.config.checkpoint_dir and every and self.trainer.steps % every == 0:
            await anyio.to_thread.run_sync(self._checkpoint)
        return None

    async def publish(self) -> None:
        """Send the current weights to every engine of the policy and wait until each
        applied them (bounded by ``sync_timeout``; an engine that does not answer is
        named in the error log and the learner goes on)."""
        version = self.trainer.version
        buckets = to_buckets(self.config.policy, version, self.trainer.model.state_dict().items())
        failed: list[str] = []

        async def push(name: str) -> None:
            try:
                with anyio.fail_after(self.config.sync_timeout):
                    engine = await self.lookup(name, timeout=self.config.sync_timeout)
                    await self._push(engine, buckets)
                self.applied[name] = version
            except Exception as error:
                failed.append(name)
                self.node.log.error(
                    "weight_sync_failed", engine=name, version=version, error=repr(error)
                )

        async with anyio.create_task_group() as tasks:
            for name in self.config.engines:
                tasks.start_soon(push, name)
        if not failed:
            self.published = version

    async def _push(self, engine: ActorRef, buckets: list[WeightBucket]) -> None:
        for bucket in buckets:
            await self.call(engine, bucket, timeout=self.config.sync_timeout)

    def _checkpoint(self) -> Path:
        trainer = self.trainer
        return write_checkpoint(
            self.config.checkpoint_dir,
            model=trainer.model,
            optimizer=trainer.optimizer,
            version=trainer.version,
            step=trainer.steps,
            consumed=trainer.consumed,
        )

    def statistics(self) -> LearnerStats:
        trainer = self.trainer
        return LearnerStats(
            policy=self.config.policy,
            version=trainer.version,
            steps=trainer.steps,
            published=self.published,
            engines=dict(self.applied),
            trained_segments=trainer.trained_segments,
            held_segments=trainer.held,
            staleness=dict(trainer.staleness),
            rejected=dict(trainer.rejected),
            last_metrics=trainer.last_metrics,
        )
