"""The learner actor: one per policy, fed scored segments by every role that policy
plays, stepping as soon as a batch is complete and publishing weights to the policy's
engines every ``sync_every`` steps.

Training runs in a worker thread inside the handler, so while a step runs the
learner's mailbox fills and senders wait for credit: the pipeline's backpressure. A
refused segment is logged with its reason and counted; it never stops the learner.
With a ``checkpoint_dir``, every accepted segment is in the learner's segment log
before its sender forgets it, so a learner killed at any moment resumes with nothing
lost and nothing trained twice (see ``segment_log``).
"""

from __future__ import annotations

import datetime
import functools
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import torch
import torch.distributed as dist

from actors.engines.weight_group import GroupAddress, WeightGroup, specs_of
from actors.engines.weights import to_buckets
from actors.ledger import LedgerWriter
from actors.messages import (
    BroadcastWeights,
    FlushBatch,
    GetEngineStats,
    GetLearnerStats,
    JoinWeightGroup,
    LearnerProgress,
    LearnerStats,
    ScoredSegment,
    WeightsWanted,
)
from learner.checkpoints import latest_checkpoint, read_checkpoint, write_checkpoint
from learner.segment_log import Record, SegmentLog, read_segments
from learner.trainer import LearnerConfig, Rejected, Trainer
from runtime import Actor, ActorRef

_LOG = "segments.log"


class LearnerActor(Actor):
    inbox = ScoredSegment | FlushBatch | GetLearnerStats | WeightsWanted
    mailbox_size = 256

    def __init__(self, model: Any, config: LearnerConfig) -> None:
        self.config = config
        self.trainer = Trainer(model, config)
        self.published = 0
        self.applied: dict[str, int] = {}
        self._store: dist.TCPStore | None = None
        self._group: WeightGroup | None = None
        self._groups_formed = 0
        self._log: SegmentLog | None = None
        self._ledger: LedgerWriter | None = None
        self.train_s = 0.0
        self.publish_s = 0.0

    async def on_start(self) -> None:
        """Resume from ``checkpoint_dir``; engines that restarted with the run get the
        resumed version at once, not only after the next step."""
        if self.config.ledger:
            self._ledger = LedgerWriter(self.config.ledger)
        if self.config.checkpoint_dir:
            await anyio.to_thread.run_sync(self._resume)
            if self.trainer.version > 0 and self.config.engines:
                await self.publish()

    def _resume(self) -> None:
        """Restore the newest checkpoint, then admit again what it held and what the
        log took in after it; steps that complete on the way are trained again (they
        were lost with the process) but not published."""
        root = Path(self.config.checkpoint_dir)
        root.mkdir(parents=True, exist_ok=True)
        trainer = self.trainer
        replay: list[Record] = []
        latest = latest_checkpoint(root)
        if latest is not None:
            state = read_checkpoint(latest, model=trainer.model, optimizer=trainer.optimizer)
            trainer.version, trainer.steps = state.version, state.step
            trainer.consumed = set(state.consumed)
            replay.extend(state.held)
        log_path = root / _LOG
        if log_path.is_file():
            replay.extend(read_segments(log_path))
        if self._ledger is not None and (latest is not None or replay):
            self._ledger.write("resumed", version=trainer.version, consumed=len(trainer.consumed))
        for scored in replay:
            if isinstance(scored, FlushBatch):
                flushed = trainer.flush()
                if flushed is not None:
                    self._train(flushed)
                continue
            try:
                batch = trainer.admit(scored)
            except Rejected as refused:
                if refused.reason != "duplicate":  # the log repeats what a checkpoint took
                    self.node.log.warning(
                        "replayed_segment_rejected", learner=self.name, detail=refused.detail
                    )
                continue
            if batch is not None:
                self._train(batch)
        self._log = SegmentLog(log_path)
        if latest is not None or replay:
            self.node.log.info(
                "learner_resumed",
                learner=self.name,
                checkpoint=str(latest),
                version=trainer.version,
                replayed=len(replay),
                held=trainer.held,
            )

    async def on_stop(self) -> None:
        if self._group is not None:
            self._group.close()
        if self._log is not None:
            self._log.close()
        if self._ledger is not None:
            held = [s.segment.segment_id for s in self.trainer.held_segments()]
            self._ledger.write("stopped", version=self.trainer.version, held=held)
            self._ledger.close()

    async def handle(
        self, message: ScoredSegment | FlushBatch | GetLearnerStats | WeightsWanted
    ) -> LearnerStats | None:
        if isinstance(message, GetLearnerStats):
            return self.statistics()
        if isinstance(message, WeightsWanted):
            await self._bring_up_to_date(message.engine)
            return None
        flushed = isinstance(message, FlushBatch)
        if isinstance(message, FlushBatch):
            batch = self.trainer.flush()
            if batch is None:
                await self._notify({}, flushed=True)
                return None
        else:
            try:
                batch = self.trainer.admit(message)
            except Rejected as refused:
                self.trainer.rejected[refused.reason] += 1
                if self._ledger is not None:
                    self._ledger.write(
                        "rejected", segment=message.segment.segment_id, reason=refused.reason
                    )
                self.node.log.warning(
                    "segment_rejected",
                    learner=self.name,
                    reason=refused.reason,
                    detail=refused.detail,
                )
                return None
        if self._log is not None:
            # On disk before the handler returns, that is before the sender forgets it.
            await anyio.to_thread.run_sync(self._log.append, message)
        if self._ledger is not None and isinstance(message, ScoredSegment):
            self._ledger.write("accepted", segment=message.segment.segment_id)
        if batch is None:
            return None
        before = self.trainer.version
        started = time.monotonic()
        metrics = await anyio.to_thread.run_sync(self._train, batch)
        self.train_s += time.monotonic() - started
        if self.trainer.version == before:
            self.node.log.info("learner_batch_skipped", learner=self.name, **metrics)
            await self._notify(metrics, flushed=flushed)
            return None
        self.node.log.info(
            "learner_step", learner=self.name, version=self.trainer.version, **metrics
        )
        if self.config.engines and self.trainer.steps % self.config.sync_every == 0:
            await self.publish()
        await self._notify(metrics, flushed=flushed)
        every = self.config.checkpoint_every
        if self.config.checkpoint_dir and every and self.trainer.steps % every == 0:
            await anyio.to_thread.run_sync(self._checkpoint)
        return None

    async def publish(self) -> None:
        """Send the current weights to every engine of the policy and wait until each
        applied them (bounded by ``sync_timeout``; an engine that does not answer is
        named in the error log and the learner goes on)."""
        version = self.trainer.version
        named = list(self.trainer.model.state_dict().items())
        started = time.monotonic()
        if self.config.sync_backend == "messages":
            applied = await self._publish_messages(version, named)
        else:
            applied = await self._publish_broadcast(version, named)
        self.publish_s += time.monotonic() - started
        for name in applied:
            self.applied[name] = version
        if len(applied) == len(self.config.engines):
            self.published = version
        if applied and self._ledger is not None:
            self._ledger.write("published", version=version, engines=sorted(applied))

    def _train(self, batch: list[ScoredSegment]) -> dict[str, float]:
        """Train on ``batch`` and record it in the ledger. Blocking."""
        before = self.trainer.version
        metrics = self.trainer.train(batch)
        if self._ledger is not None:
            self._ledger.write(
                "batch",
                version=self.trainer.version,
                stepped=self.trainer.version != before,
                segments=[scored.segment.segment_id for scored in batch],
            )
        return metrics

    async def _bring_up_to_date(self, engine: str) -> None:
        """Send the current weights, as messages, to ``engine`` if it is behind them
        (whatever ``sync_backend`` is: the weight group of a broadcast lost the engine
        when its process died, and the next publication forms a new one)."""
        if engine not in self.config.engines or self.trainer.version == 0:
            return
        timeout = self.config.sync_timeout
        try:
            ref = await self.lookup(engine, timeout=timeout)
            stats = await self.call(ref, GetEngineStats(), timeout=timeout)
        except Exception as error:
            self._sync_failed(engine, self.trainer.version, error)
            return
        if stats.version >= self.trainer.version:
            return
        self.node.log.info(
            "engine_behind", engine=engine, version=stats.version, learner=self.trainer.version
        )
        named = list(self.trainer.model.state_dict().items())
        if await self._publish_messages(self.trainer.version, named, engines=[engine]):
            self.applied[engine] = self.trainer.version

    async def _publish_messages(
        self,
        version: int,
        named: list[tuple[str, torch.Tensor]],
        *,
        engines: list[str] | None = None,
    ) -> list[str]:
        buckets = to_buckets(
            self.config.policy, version, named, bucket_bytes=self.config.sync_bucket_bytes
        )
        timeout = self.config.sync_timeout
        applied: list[str] = []

        async def push(name: str) -> None:
            try:
                with anyio.fail_after(timeout):
                    engine = await self.lookup(name, timeout=timeout)
                    for bucket in buckets:
                        await self.call(engine, bucket, timeout=timeout)
                applied.append(name)
            except Exception as error:
                self._sync_failed(name, version, error)

        async with anyio.create_task_group() as tasks:
            for name in self.config.engines if engines is None else engines:
                tasks.start_soon(push, name)
        return applied

    async def _publish_broadcast(
        self, version: int, named: list[tuple[str, torch.Tensor]]
    ) -> list[str]:
        """One broadcast to every engine at once. A collective with a member missing
        cannot finish, so any failure aborts the group for all and is reported for
        every engine that did not apply the version; the next version forms a new group."""
        config = self.config
        timeout = config.sync_timeout
        applied: list[str] = []
        try:
            with anyio.fail_after(timeout):
                engines = [await self.lookup(name, timeout=timeout) for name in config.engines]
                if self._group is None:
                    self._group = await self._form_group(engines)
                group = self._group
                request = BroadcastWeights(
                    config.policy,
                    version,
                    group.address.name,
                    specs_of(named),
                    config.sync_bucket_bytes,
                )

                async def receive(name: str, engine: ActorRef) -> None:
                    try:
                        await self.call(engine, request, timeout=timeout)
                    except BaseException:
                        group.close()  # one member gave up: the others must not wait for it
                        raise
                    applied.append(name)

                async with anyio.create_task_group() as tasks:
                    for name, engine in zip(config.engines, engines, strict=True):
                        tasks.start_soon(receive, name, engine)
                    await anyio.to_thread.run_sync(
                        group.send, named, config.sync_bucket_bytes, abandon_on_cancel=True
                    )
        except Exception as error:
            if self._group is not None:
                self._group.close()
                self._group = None
            for name in config.engines:
                if name not in applied:
                    self._sync_failed(name, version, error)
        return applied

    async def _form_group(self, engines: list[ActorRef]) -> WeightGroup:
        config = self.config
        if self._store is None:
            self._store = await anyio.to_thread.run_sync(
                lambda: dist.TCPStore(
                    config.sync_host,
                    0,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=config.sync_timeout),
                )
            )
        store: dist.TCPStore = self._store
        self._groups_formed += 1
        address = GroupAddress(
            config.sync_host,
            store.port,
            f"{config.policy}/{self._groups_formed}",
            1 + len(engines),
            config.sync_backend,
            config.sync_timeout,
        )
        async with anyio.create_task_group() as tasks:
            for rank, engine in enumerate(engines, start=1):
                join = JoinWeightGroup(
                    config.policy,
                    address.name,
                    address.host,
                    address.port,
                    rank,
                    address.world_size,
                    address.backend,
                    address.timeout_s,
                )
                tasks.start_soon(
                    functools.partial(self.call, engine, join, timeout=config.sync_timeout)
                )
            group = await anyio.to_thread.run_sync(
                WeightGroup, address, 0, store, abandon_on_cancel=True
            )
        return group

    async def _notify(self, metrics: dict[str, float], *, flushed: bool = False) -> None:
        trainer = self.trainer
        batches = trainer.steps + trainer.skipped_batches
        progress = LearnerProgress(
            self.config.policy, trainer.version, metrics, batches, flushed=flushed
        )
        for name in self.config.notify:
            try:
                target = await self.lookup(name, timeout=self.config.sync_timeout)
                await self.send(target, progress)
            except Exception as error:
                self.node.log.error("learner_notify_failed", target=name, error=repr(error))

    def _sync_failed(self, engine: str, version: int, error: BaseException) -> None:
        self.node.log.error("weight_sync_failed", engine=engine, version=version, error=repr(error))

    def _checkpoint(self) -> Path:
        trainer = self.trainer
        path = write_checkpoint(
            self.config.checkpoint_dir,
            model=trainer.model,
            optimizer=trainer.optimizer,
            version=trainer.version,
            step=trainer.steps,
            consumed=trainer.consumed,
            held=trainer.held_segments(),
        )
        if self._log is not None:
            self._log.restart()
        return path

    def statistics(self) -> LearnerStats:
        trainer = self.trainer
        return LearnerStats(
            policy=self.config.policy,
            version=trainer.version,
            steps=trainer.steps,
            published=self.published,
            engines=dict(self.applied),
            trained_segments=trainer.trained_segments,
            skipped_batches=trainer.skipped_batches,
            held_segments=trainer.held,
            staleness=dict(trainer.staleness),
            rejected=dict(trainer.rejected),
            last_metrics=trainer.last_metrics,
            train_s=self.train_s,
            publish_s=self.publish_s,
        )
