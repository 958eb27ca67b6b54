"""The training side of a learner, without the runtime: admit scored segments, form
batches, and take optimizer steps. ``LearnerActor`` runs it on a node.

Admission refuses, and counts by reason, what cannot be trained on: another policy or
an unknown role, mismatched lengths, non-finite logprobs, token ids outside the
vocabulary, tokens sampled more than ``max_staleness`` versions ago, and segments it has
seen before (delivery is at-least-once, so a redelivered segment is dropped, not trained
twice).
"""

from __future__ import annotations

import copy
import ctypes
import math
import sys
import time
from collections import Counter
from typing import Any, Literal

import msgspec
import numpy as np
import torch

from actors.messages import ScoredSegment, Segment
from actors.sampling import processed_logprobs
from learner.advantages import grpo_advantages, normalise_per_role, reinforce_pp_advantages
from learner.batching import BufferFull, CountBuffer, GroupBuffer, micro_batches
from learner.losses import LossConfig, LossInputs, loss_named
from learner.packing import pack, shared_prompt_units, unit_size


class LearnerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One learner's settings. ``algorithm`` grpo batches ``groups_per_batch`` whole
    groups; reinforce_pp batches ``segments_per_batch`` actions and puts ``beta`` * k1
    KL to the initial policy in the reward. ``roles`` empty accepts every role.

    Weights go to ``engines`` every ``sync_every`` steps: as runtime messages
    (``sync_backend`` messages) or broadcast through a torch.distributed group (gloo,
    nccl) whose store the learner serves on ``sync_host``; ``sync_timeout`` bounds every
    step of a publication. After every step the actors named in ``notify`` get a
    ``LearnerProgress``."""

    policy: str
    algorithm: Literal["grpo", "reinforce_pp"] = "grpo"
    loss: str = "ppo_clip"
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    groups_per_batch: int = 16
    segments_per_batch: int = 64
    scale_by_std: bool = True
    beta: float = 0.01
    per_role_normalisation: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    token_budget: int = 8192
    max_staleness: int = 4
    max_held_segments: int = 4096
    roles: list[str] = []
    engines: list[str] = []
    notify: list[str] = []
    sync_every: int = 1
    sync_timeout: float = 120.0
    sync_backend: Literal["messages", "gloo", "nccl"] = "messages"
    sync_host: str = "127.0.0.1"
    sync_bucket_bytes: int = 64 << 20
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    ledger: str = ""
    """A file to record accepted, refused and trained segments in (``actors.ledger``)."""


def _return_free_memory() -> None:
    """Give the heap memory a step freed back to the OS. Measured on the 100M learner
    benchmark: after training steps, publishing the weights as messages took 0.93 s
    against 0.27 s once glibc's free heap was trimmed (a full garbage collection did
    not help)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


_LIBC = ctypes.CDLL("libc.so.6") if sys.platform == "linux" else None


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Trainer:
    def __init__(self, model: Any, config: LearnerConfig, *, version: int = 0) -> None:
        self.model = model
        self.config = config
        self.version = version
        self.steps = 0
        self.vocab_size = int(model.config.vocab_size)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        needs_reference = (config.algorithm == "reinforce_pp" and config.beta > 0) or (
            config.kl_coef > 0
        )
        self.reference = copy.deepcopy(model).requires_grad_(False) if needs_reference else None
        self.loss = loss_named(config.loss)
        self.loss_config = LossConfig(
            config.clip_low, config.clip_high, config.tis_cap, config.kl_coef, config.kl_estimator
        )
        self.groups = GroupBuffer(max_segments=config.max_held_segments)
        self.counted = CountBuffer(config.segments_per_batch)
        self._ready: list[list[ScoredSegment]] = []
        self.consumed: set[str] = set()
        self._held: dict[str, ScoredSegment] = {}  # in admission order
        self.staleness: Counter[int] = Counter()
        self.rejected: Counter[str] = Counter()
        self.trained_segments = 0
        self.skipped_batches = 0
        """Batches whose every group had equal rewards: no gradient, so no step and no
        new version; their segments count as consumed."""
        self.last_metrics: dict[str, float] = {}

    # -- admission ----------------------------------------------------------------------

    def admit(self, scored: ScoredSegment) -> list[ScoredSegment] | None:
        """Take a segment in; returns a batch once one is complete. Raises Rejected."""
        segment = scored.segment
        self._check(scored)
        oldest = int(segment.versions.min())
        stale = self.version - oldest
        if stale > self.config.max_staleness:
            raise Rejected(
                "stale",
                f"segment {segment.segment_id!r} has tokens of version {oldest}, "
                f"{stale} behind the learner's {self.version} (max_staleness "
                f"{self.config.max_staleness})",
            )
        try:
            if self.config.algorithm == "grpo":
                batch_part = self.groups.add(scored)
            else:
                batch_part = self.counted.add(scored)
        except BufferFull as full:
            raise Rejected("buffer_full", str(full)) from None
        self._held[segment.segment_id] = scored
        for version, count in zip(
            *np.unique(self.version - segment.versions, return_counts=True), strict=True
        ):
            self.staleness[int(version)] += int(count)
        if batch_part is None:
            return None
        if self.config.algorithm == "reinforce_pp":
            return batch_part
        self._ready.append(batch_part)
        if len(self._ready) < self.config.groups_per_batch:
            return None
        batch = [scored for group in self._ready for scored in group]
        self._ready = []
        return batch

    def flush(self) -> list[ScoredSegment] | None:
        """The complete groups (GRPO) or the counted actions (REINFORCE++) held, as a
        batch of their own; None when there are none."""
        if self.config.algorithm == "grpo":
            batch = [scored for group in self._ready for scored in group]
            self._ready = []
        else:
            batch = self.counted.take()
        return batch or None

    def _check(self, scored: ScoredSegment) -> None:
        segment = scored.segment
        sid = segment.segment_id
        if sid in self.consumed or sid in self._held:
            raise Rejected("duplicate", f"segment {sid!r} was received before")
        if segment.policy != self.config.policy:
            raise Rejected("wrong_policy", f"segment {sid!r} is for policy {segment.policy!r}")
        if self.config.roles and segment.role not in self.config.roles:
            raise Rejected("unknown_role", f"segment {sid!r} has role {segment.role!r}")
        n = len(segment.completion_ids)
        if n == 0 or len(segment.logprobs) != n or len(segment.versions) != n:
            raise Rejected(
                "mismatched_lengths",
                f"segment {sid!r}: {n} completion tokens, {len(segment.logprobs)} logprobs, "
                f"{len(segment.versions)} versions",
            )
        if not np.all(np.isfinite(segment.logprobs)) or not math.isfinite(scored.reward):
            raise Rejected("not_finite", f"segment {sid!r} has a NaN or infinite logprob or reward")
        ids = np.concatenate([segment.prompt_ids, segment.completion_ids])
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise Rejected(
                "bad_token", f"segment {sid!r} has token ids outside 0..{self.vocab_size - 1}"
            )

    # -- training -----------------------------------------------------------------------

    def train(self, batch: list[ScoredSegment]) -> dict[str, float]:
        """One optimizer step on ``batch`` (none if every group was filtered out for
        equal rewards); returns what to log. Blocking: run it in a worker thread."""
        start = time.perf_counter()
        segments = [s.segment for s in batch]
        rewards = torch.tensor([s.reward for s in batch], dtype=torch.float32)
        lengths = [len(s.completion_ids) for s in segments]
        width = max(lengths)
        mask = torch.zeros(len(segments), width)
        behaviour = torch.zeros(len(segments), width)
        for i, segment in enumerate(segments):
            mask[i, : lengths[i]] = 1
            behaviour[i, : lengths[i]] = torch.from_numpy(segment.logprobs.astype(np.float32))
        metrics: dict[str, float] = {"reward_mean": float(rewards.mean())}
        if self.config.algorithm == "grpo":
            grouped = grpo_advantages(
                rewards, [s.group for s in segments], scale_by_std=self.config.scale_by_std
            )
            advantages = grouped.advantages[:, None] * mask
            keep = grouped.kept
            metrics["zero_variance_groups"] = grouped.zero_variance_groups
        else:
            reference = self._reference_logprobs(segments, width)
            advantages = reinforce_pp_advantages(
                rewards, behaviour, reference, mask, beta=self.config.beta
            )
            roles = [s.role for s in segments]
            if self.config.per_role_normalisation and len(set(roles)) > 1:
                advantages = normalise_per_role(advantages, mask, roles)
            keep = torch.ones(len(segments), dtype=torch.bool)
        rows = [i for i in range(len(segments)) if keep[i]]
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(lengths[i] for i in rows)
        totals: dict[str, float] = {}
        if rows:
            kept = [segments[i] for i in rows]
            units = shared_prompt_units(kept, self.config.token_budget)
            sizes = [unit_size(kept, unit) for unit in units]
            for piece in micro_batches(sizes, self.config.token_budget):
                chosen = [rows[j] for u in piece for j in units[u]]
                logprobs = self.token_logprobs([segments[i] for i in chosen], width, self.model)
                inputs = LossInputs(
                    logprobs=logprobs,
                    behaviour=behaviour[chosen],
                    advantages=advantages[chosen],
                    mask=mask[chosen],
                    proximal=logprobs.detach(),
                    reference=(
                        self._reference_logprobs([segments[i] for i in chosen], width)
                        if self.config.kl_coef > 0
                        else None
                    ),
                )
                loss, piece_metrics = self.loss(inputs, self.loss_config)
                share = float(mask[chosen].sum()) / tokens
                torch.autograd.backward(loss * share)
                piece_metrics["loss"] = float(loss.detach())
                for name, value in piece_metrics.items():
                    totals[name] = totals.get(name, 0.0) + value * share
            norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.config.max_grad_norm
            )
            self.optimizer.step()
            metrics["grad_norm"] = float(norm)
        self.consume(segments, stepped=bool(rows))
        metrics.update(totals)
        metrics["tokens_per_s"] = tokens / (time.perf_counter() - start)
        _return_free_memory()
        self.last_metrics = metrics
        return metrics

    def consume(self, segments: list[Segment], *, stepped: bool) -> None:
        """Count a batch as trained on: a new version if it made a step, and its segments
        consumed (a redelivery of any of them is a duplicate from now on)."""
        if stepped:
            self.version += 1
            self.steps += 1
        else:
            self.skipped_batches += 1
        for segment in segments:
            self.consumed.add(segment.segment_id)
            self._held.pop(segment.segment_id, None)
        self.trained_segments += len(segments)

    def token_logprobs(self, segments: list[Segment], width: int, model: Any) -> torch.Tensor:
        """``[rows, width]`` logprobs of each completion token under ``model``, processed
        with the sampling parameters that produced it (see ``actors.sampling``); 0 past
        a row's end. Segments that share a prompt are run as one packed row
        (``learner.packing``)."""
        packed = pack(segments, width, self.config.token_budget)
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=packed.attention_mask,
        ).logits
        inside, targets = packed.inside, packed.targets
        params = [s.sampling for s in segments]
        logprobs = processed_logprobs(
            logits[packed.rows, packed.sources],
            torch.tensor([p.temperature for p in params])[:, None].expand(-1, width),
            torch.tensor([p.top_k for p in params])[:, None].expand(-1, width),
            torch.tensor([p.top_p for p in params])[:, None].expand(-1, width),
        )
        chosen = logprobs.gather(2, targets[..., None])[..., 0]
        return torch.where(inside, chosen, 0.0)

    def _reference_logprobs(self, segments: list[Segment], width: int) -> torch.Tensor:
        if self.reference is None:
            return torch.zeros(len(segments), width)
        with torch.no_grad():
            return self.token_logprobs(segments, width, self.reference)

    @property
    def held(self) -> int:
        return len(self._held)

    def held_segments(self) -> list[ScoredSegment]:
        """The accepted segments not trained on yet, in the order they were admitted:
        admitted again in this order, they rebuild the same buffers."""
        return list(self._held.values())
