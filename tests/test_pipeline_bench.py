"""The pipeline-under-load benchmark's simulated compute, and its schedules run on the
real pipeline (agents, conductor, engine and learner actors) in one process: the
synchronous schedule trains only on tokens of the current version, streaming runs
ahead within its staleness bound, and in both nothing emitted is lost."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.engines.base import EngineActor
from actors.messages import Generate, GetEngineStats, SamplingParams
from actors.models import Checkpoint, load_checkpoint
from benchmarks.pipeline import QUICK, Layout, drive, learner_config
from benchmarks.pipeline_node import POLICY
from benchmarks.pipeline_sim import (
    SimulatedEngine,
    SimulatedLearner,
    Workload,
    sample_lengths,
)
from runtime.testing import open_cluster

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> Checkpoint:
    return load_checkpoint(tiny_path)


def test_lengths_are_the_median_without_a_tail_and_clipped_with_one() -> None:
    rng = np.random.default_rng(0)
    flat = sample_lengths(Workload(median_tokens=40, sigma=0.0), 100, rng)
    assert set(flat.tolist()) == {40}
    tailed = sample_lengths(Workload(median_tokens=40, sigma=1.5, max_tokens=200), 4000, rng)
    assert tailed.min() >= 1 and tailed.max() == 200
    assert 35 <= np.median(tailed) <= 45


async def test_tokens_carry_the_version_live_when_they_were_made(
    tiny: Checkpoint, autojump_clock: object
) -> None:
    import trio

    workload = Workload(median_tokens=100, sigma=0.0, decode_tokens_per_s=100.0, slots=4)
    engine = SimulatedEngine(tiny, workload, policy=POLICY)
    weights = list(tiny.model.state_dict().items())
    request = Generate("r", SamplingParams(n=2, max_tokens=8), prompt_ids=np.arange(5))
    samples = []
    async with trio.open_nursery() as nursery:

        async def generate() -> None:
            samples.extend(await engine.generate(request))

        nursery.start_soon(generate)
        await trio.sleep(0.5)  # half-way through the 1-second completions
        await engine.update_weights(1, weights)
    assert [len(s.completion_ids) for s in samples] == [100, 100]
    for sample in samples:
        versions = sample.versions.tolist()
        assert versions == sorted(versions)
        assert 45 <= versions.count(0) <= 55 and versions[-1] == 1
        assert "\\boxed{" in sample.text and sample.text.split()[-1] in {"Correct", "Wrong"}


async def test_a_weight_update_of_the_wrong_shape_is_refused(tiny: Checkpoint) -> None:
    engine = SimulatedEngine(tiny, Workload(), policy=POLICY)
    name, tensor = next(iter(tiny.model.state_dict().items()))
    with pytest.raises(ValueError, match=name):
        await engine.update_weights(1, [(name, torch.zeros(tensor.numel() + 1))])


@pytest.mark.parametrize("mode", ["synchronous", "streaming s=2"])
async def test_schedules_train_on_the_real_pipeline_and_lose_nothing(
    mode: str, tiny: Checkpoint
) -> None:
    workload = Workload(median_tokens=8, sigma=1.0, max_tokens=64, slots=64, step_s=0.0)
    plan = dataclasses.replace(QUICK, workload=workload, batches=3)
    layout = Layout(engines=2, engine_nodes=1)
    async with open_cluster("head", "engines", "learner") as (head, engines, learner):
        for index in range(layout.engines):
            core = SimulatedEngine(tiny, workload, policy=POLICY, seed=index)
            await engines.spawn(f"engine/{POLICY}/{index}", functools.partial(EngineActor, core))
        config = learner_config(layout)
        await learner.spawn(
            f"learner/{POLICY}", lambda: SimulatedLearner(tiny.model, config, step_s=0.0)
        )
        result = await drive(head, mode, layout, plan)
        engine_ref = await head.lookup(f"engine/{POLICY}/0", timeout=5)
        stats = await head.call(engine_ref, GetEngineStats(), timeout=5)
    assert result["versions"] >= plan.batches
    assert result["episodes_failed"] == 0 and result["rejected"] == 0
    assert result["trained_segments"] + result["held_segments"] == result["emitted_segments"]
    assert stats.busy_s > 0 and stats.busy_s * 2 < stats.sequence_s  # 8 samples a request
    if mode == "synchronous":
        assert set(result["staleness"]) == {0}
    else:
        assert max(result["staleness"]) > 0
