"""A learner publishes every version to all its engines, as messages or as a gloo
broadcast, and knows which engine applied which version; an engine that cannot take
part costs a timeout and an error naming it, never the learner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog
import torch

from actors.engines import EngineActor
from actors.engines.torch_engine import TorchEngine, open_torch_engine
from actors.engines.weight_group import bucket_layout, check_specs, specs_of
from actors.messages import GetLearnerStats, TensorSpec, WeightsWanted
from actors.models import load_checkpoint
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig
from runtime import Node
from runtime.testing import open_cluster
from tests.learner.segments import scored


@asynccontextmanager
async def engines_on(node: Node, tiny_path: Path, count: int) -> AsyncIterator[list[TorchEngine]]:
    async with AsyncExitStack() as stack:
        cores = []
        for index in range(count):
            core = await stack.enter_async_context(
                open_torch_engine(load_checkpoint(tiny_path), policy="p")
            )
            await node.spawn(f"engine/p/{index}", lambda c=core: EngineActor(c))
            cores.append(core)
        yield cores


def two_engines(backend: str, **settings: Any) -> LearnerConfig:
    """A learner of policy ``p`` that steps on every group and publishes to two engines."""
    return msgspec.convert(
        {
            "policy": "p",
            "lr": 1e-3,
            "groups_per_batch": 1,
            "engines": ["engine/p/0", "engine/p/1"],
            "sync_backend": backend,
            "sync_timeout": 60,
            **settings,
        },
        LearnerConfig,
    )


async def train_steps(node: Node, learner_name: str, steps: int) -> None:
    learner = await node.lookup(learner_name, timeout=5)
    for step in range(steps):
        await node.send(learner, scored(f"a{step}", group=f"g{step}", reward=1.0))
        await node.send(learner, scored(f"b{step}", group=f"g{step}", reward=0.0))


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["messages", "gloo"])
async def test_every_engine_gets_every_version(tiny_path: Path, backend: str) -> None:
    config = two_engines(backend, sync_bucket_bytes=256 << 10)
    model = load_checkpoint(tiny_path).model
    async with (
        open_cluster("head", "learner") as (head, node),
        engines_on(head, tiny_path, 2) as cores,
    ):
        actor = LearnerActor(model, config)
        learner = await node.spawn("learner/p", lambda: actor)
        await train_steps(head, "learner/p", 2)
        stats = await head.call(learner, GetLearnerStats(), timeout=120)
        groups_formed = actor._groups_formed
    assert (stats.version, stats.published) == (2, 2)
    assert stats.engines == {"engine/p/0": 2, "engine/p/1": 2}
    assert groups_formed == (1 if backend == "gloo" else 0)
    learned = model.state_dict()
    for core in cores:
        assert core.version == 2 and core.statistics().updates == 2
        for name, tensor in core.model.state_dict().items():
            assert torch.equal(tensor, learned[name]), name


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["messages", "gloo"])
async def test_a_missing_engine_times_out_by_name_and_the_learner_goes_on(
    tiny_path: Path, backend: str
) -> None:
    config = LearnerConfig(
        policy="p",
        groups_per_batch=1,
        engines=["engine/p/0", "engine/p/gone"],
        sync_backend=backend,  # type: ignore[arg-type]
        sync_timeout=1.0,
    )
    async with (
        open_cluster("head", "learner") as (head, node),
        engines_on(head, tiny_path, 1),
    ):
        learner = await node.spawn(
            "learner/p", lambda: LearnerActor(load_checkpoint(tiny_path).model, config)
        )
        with structlog.testing.capture_logs() as logs:
            await train_steps(head, "learner/p", 2)
            stats = await head.call(learner, GetLearnerStats(), timeout=120)
    failures = [e for e in logs if e["event"] == "weight_sync_failed"]
    assert {(e["engine"], e["version"]) for e in failures} >= {
        ("engine/p/gone", 1),
        ("engine/p/gone", 2),
    }
    assert stats.steps == 2 and stats.published == 0
    assert stats.engines.get("engine/p/gone") is None
    if backend == "messages":
        assert stats.engines == {"engine/p/0": 2}


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["messages", "gloo"])
async def test_a_restarted_engine_that_asks_gets_the_current_weights(
    tiny_path: Path, backend: str
) -> None:
    """An engine started again serves its initial weights; the tokens it samples are
    too stale to train on, so no step would come to publish newer ones. Asked, the
    learner sends the current weights to that engine, and only to an engine behind."""
    config = two_engines(backend)
    model = load_checkpoint(tiny_path).model
    async with (
        open_cluster("head", "learner") as (head, node),
        engines_on(head, tiny_path, 2) as cores,
        open_torch_engine(load_checkpoint(tiny_path), policy="p") as restarted,
    ):
        learner = await node.spawn("learner/p", lambda: LearnerActor(model, config))
        await train_steps(head, "learner/p", 2)
        await head.call(learner, GetLearnerStats(), timeout=120)
        await head.stop("engine/p/1")
        await head.spawn("engine/p/1", lambda: EngineActor(restarted))
        with structlog.testing.capture_logs() as logs:
            await head.send(learner, WeightsWanted("engine/p/0"))
            await head.send(learner, WeightsWanted("engine/p/1"))
            stats = await head.call(learner, GetLearnerStats(), timeout=120)
    assert [e["engine"] for e in logs if e["event"] == "engine_behind"] == ["engine/p/1"]
    assert not [e for e in logs if e["event"] == "weight_sync_failed"]
    assert restarted.version == 2 and restarted.statistics().updates == 1
    assert cores[0].statistics().updates == 2  # it was current: nothing sent again
    assert stats.engines == {"engine/p/0": 2, "engine/p/1": 2}
    learned = model.state_dict()
    for name, tensor in restarted.model.state_dict().items():
        assert torch.equal(tensor, learned[name]), name


def test_both_ends_lay_out_buckets_alike_and_specs_are_checked_before_receiving() -> None:
    named = [
        ("a", torch.zeros(4, 4)),
        ("b", torch.zeros(100)),
        ("c", torch.zeros(2, dtype=torch.bfloat16)),
    ]
    specs = specs_of(named)
    assert specs[2] == TensorSpec("c", "bfloat16", [2])
    assert bucket_layout(specs, 64) == [[0], [1], [2]]
    assert bucket_layout(specs, 1 << 20) == [[0, 1, 2]]
    shapes = {"a": (4, 4), "b": (100,), "c": (2,)}
    check_specs(specs, shapes, "p")
    with pytest.raises(ValueError, match=r"weight 'b' has shape \[100\], the model's is \[99\]"):
        check_specs(specs, {**shapes, "b": (99,)}, "p")
    with pytest.raises(ValueError, match="'c' is not a parameter"):
        check_specs(specs, {"a": (4, 4), "b": (100,)}, "p")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        check_specs([TensorSpec("a", "int8", [4, 4])], shapes, "p")
