"""The learner refuses, by reason and without stopping, what it cannot train on; it
resumes from its checkpoint with the same version and without training a segment
twice; shared and per-role topologies come from configuration alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.messages import GetLearnerStats, ScoredSegment
from actors.models import load_checkpoint
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig, Rejected, Trainer
from runtime.testing import open_cluster
from tests.learner.segments import scored


@pytest.fixture
def trainer(tiny_path: Path) -> Trainer:
    config = LearnerConfig(policy="p", lr=1e-3, groups_per_batch=1, roles=["solver", "verifier"])
    return Trainer(load_checkpoint(tiny_path).model, config)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (scored("x", policy="q"), "wrong_policy"),
        (scored("x", role="judge"), "unknown_role"),
        (scored("x", logprobs=[-1.0, -1.0]), "mismatched_lengths"),
        (scored("x", versions=[0]), "mismatched_lengths"),
        (scored("x", logprobs=[-1.0, float("nan"), -1.0]), "not_finite"),
        (scored("x", reward=float("inf")), "not_finite"),
        (scored("x", completion=[16, 99999]), "bad_token"),
    ],
)
def test_bad_segments_are_refused_by_reason(
    trainer: Trainer, bad: ScoredSegment, reason: str
) -> None:
    with pytest.raises(Rejected) as refused:
        trainer.admit(bad)
    assert refused.value.reason == reason
    assert bad.segment.segment_id in refused.value.detail
    assert trainer.held == 0


def test_stale_and_duplicate_segments_are_refused(trainer: Trainer) -> None:
    trainer.version = 6
    with pytest.raises(Rejected, match="6 behind") as refused:
        trainer.admit(scored("old", versions=[0, 1, 2]))
    assert refused.value.reason == "stale"
    assert trainer.admit(scored("a", versions=[2, 3, 3])) is None
    with pytest.raises(Rejected) as again:
        trainer.admit(scored("a"))
    assert again.value.reason == "duplicate"
    assert trainer.staleness == {4: 1, 3: 2}


def test_a_complete_group_trains_one_step_and_is_remembered(trainer: Trainer) -> None:
    before = [p.detach().clone() for p in trainer.model.parameters()]
    assert trainer.admit(scored("a", reward=1.0)) is None
    batch = trainer.admit(scored("b", reward=0.0))
    assert batch is not None and len(batch) == 2
    metrics = trainer.train(batch)
    assert trainer.version == 1 and trainer.consumed == {"a", "b"}
    assert metrics["zero_variance_groups"] == 0 and metrics["grad_norm"] > 0
    changed = [
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    ]
    assert any(changed)
    with pytest.raises(Rejected, match="received before"):
        trainer.admit(scored("a"))


@pytest.mark.anyio
async def test_a_learner_keeps_serving_after_bad_segments(tiny_path: Path) -> None:
    config = LearnerConfig(policy="p", groups_per_batch=1)
    async with open_cluster("head", "learner") as (head, node):
        model = load_checkpoint(tiny_path).model
        learner = await node.spawn("learner/p", lambda: LearnerActor(model, config))
        for bad in (scored("x", policy="q"), scored("y", logprobs=[float("nan")] * 3)):
            await head.send(learner, bad)
        await head.send(learner, scored("a", reward=1.0))
        await head.send(learner, scored("b", reward=0.0))
        stats = await head.call(learner, GetLearnerStats(), timeout=60)
    assert stats.rejected == {"wrong_policy": 1, "not_finite": 1}
    assert (stats.version, stats.trained_segments) == (1, 2)


@pytest.mark.anyio
async def test_a_restarted_learner_resumes_from_its_checkpoint(
    tiny_path: Path, tmp_path: Path
) -> None:
    config = LearnerConfig(
        policy="p", groups_per_batch=1, lr=1e-3, checkpoint_dir=str(tmp_path), checkpoint_every=1
    )
    trained = load_checkpoint(tiny_path).model
    async with open_cluster("head", "learner") as (head, node):
        learner = await node.spawn("learner/p", lambda: LearnerActor(trained, config))
        await head.send(learner, scored("a", reward=1.0))
        await head.send(learner, scored("b", reward=0.0))
        assert (await head.call(learner, GetLearnerStats(), timeout=60)).version == 1
    # A new process: fresh weights from the base checkpoint, the same checkpoint directory.
    resumed = load_checkpoint(tiny_path).model
    async with open_cluster("head", "learner") as (head, node):
        learner = await node.spawn("learner/p", lambda: LearnerActor(resumed, config))
        await head.send(learner, scored("a", reward=1.0))  # redelivered: trained already
        await head.send(learner, scored("c", group="h", reward=1.0))
        await head.send(learner, scored("d", group="h", reward=0.0))
        stats = await head.call(learner, GetLearnerStats(), timeout=60)
    assert stats.rejected == {"duplicate": 1}
    assert (stats.version, stats.steps, stats.trained_segments) == (2, 2, 2)


@pytest.mark.anyio
@pytest.mark.parametrize("topology", ["shared", "per_role"])
async def test_topologies_come_from_configuration(tiny_path: Path, topology: str) -> None:
    """Shared: one learner fed by every role. Per role: one learner per role's policy."""
    roles = ["solver", "verifier"]
    policies = {"shared": {"solver": "team", "verifier": "team"}, "per_role": {r: r for r in roles}}
    routing = policies[topology]
    async with open_cluster("head", "learner") as (head, node):
        learners = {}
        for policy in sorted(set(routing.values())):
            config = LearnerConfig(policy=policy, groups_per_batch=1, roles=roles)
            model = load_checkpoint(tiny_path).model
            learners[policy] = await node.spawn(
                f"learner/{policy}", lambda m=model, c=config: LearnerActor(m, c)
            )
        for role in roles:
            policy = routing[role]
            for i, reward in enumerate((1.0, 0.0)):
                segment = scored(f"{role}{i}", group=role, role=role, policy=policy, reward=reward)
                await head.send(learners[policy], segment)
        stats = {
            p: await head.call(ref, GetLearnerStats(), timeout=60) for p, ref in learners.items()
        }
    if topology == "shared":
        assert stats["team"].trained_segments == 4 and stats["team"].steps == 2
    else:
        assert {p: (s.trained_segments, s.steps) for p, s in stats.items()} == {
            "solver": (2, 1),
            "verifier": (2, 1),
        }


def test_a_batch_of_equal_rewards_is_consumed_without_a_step(trainer: Trainer) -> None:
    assert trainer.admit(scored("a", reward=1.0)) is None
    batch = trainer.admit(scored("b", reward=1.0))
    assert batch is not None
    metrics = trainer.train(batch)
    assert metrics["zero_variance_groups"] == 1
    assert (trainer.version, trainer.steps, trainer.skipped_batches) == (0, 0, 1)
    assert trainer.consumed == {"a", "b"}


def test_a_flush_trains_the_complete_groups_held_and_leaves_partial_ones(
    tiny_path: Path,
) -> None:
    config = LearnerConfig(policy="p", lr=1e-3, groups_per_batch=4)
    trainer = Trainer(load_checkpoint(tiny_path).model, config)
    assert trainer.flush() is None
    for segment in (scored("a", reward=1.0), scored("b", reward=0.0), scored("c", group="h")):
        assert trainer.admit(segment) is None
    batch = trainer.flush()
    assert batch is not None and [s.segment.segment_id for s in batch] == ["a", "b"]
    trainer.train(batch)
    assert (trainer.version, trainer.held, trainer.flush()) == (1, 1, None)
