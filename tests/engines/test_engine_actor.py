"""An engine on the runtime: requests and weight buckets as messages between nodes,
in-process over the memory transport and in an engine node process of its own."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import anyio
import anyio.abc
import numpy as np
import pytest
import torch
import torch.distributed as dist

from actors.engines import EngineActor, EngineCore, to_buckets
from actors.engines.weight_group import GroupAddress, WeightGroup, specs_of
from actors.messages import (
    BroadcastWeights,
    Generate,
    GetEngineStats,
    JoinWeightGroup,
    SamplingParams,
    TensorSpec,
    WeightBucket,
)
from actors.models import Checkpoint
from runtime import ActorRef, Node, RemoteError, open_node
from runtime.testing import open_cluster
from tests.engines.test_engine_conformance import PROMPT, argmax_loop, perturbed

pytestmark = pytest.mark.anyio


async def ready_line(stdout: anyio.abc.ByteReceiveStream) -> dict[str, str]:
    """The engine node's JSON ready line (anything a library printed before it is skipped)."""
    buffered = b""
    while True:
        buffered += await stdout.receive()
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line.startswith(b'{"ready"'):
                parsed: dict[str, str] = json.loads(line)
                return parsed


async def push(node: Node, engine: ActorRef, buckets: list[WeightBucket]) -> list[bool]:
    return [(await node.call(engine, bucket, timeout=60)).applied for bucket in buckets]


async def test_generate_and_weight_buckets_travel_as_messages(
    engine: EngineCore, reference: Checkpoint
) -> None:
    async with open_cluster("head", "gpu0") as (head, worker):
        await worker.spawn("engine/solver/0", lambda: EngineActor(engine))
        ref = await head.lookup("engine/solver/0", timeout=5)
        request = Generate("r1", SamplingParams(n=2, max_tokens=8, seed=1), prompt_ids=PROMPT)
        generation = await head.call(ref, request, timeout=60)
        assert generation.policy == "solver" and len(generation.samples) == 2
        assert generation.samples[0].completion_ids.dtype == np.int32

        weights = perturbed(reference, seed=3)
        buckets = to_buckets("solver", engine.version + 1, weights, bucket_bytes=64 << 10)
        assert len(buckets) > 2
        assert await push(head, ref, buckets[::-1]) == [False] * (len(buckets) - 1) + [True]
        stats = await head.call(ref, GetEngineStats(), timeout=5)
        assert stats.version == buckets[0].version

        reference.model.load_state_dict(dict(weights))
        greedy = Generate("g", SamplingParams(temperature=0.0, max_tokens=12), prompt_ids=PROMPT)
        (sample,) = (await head.call(ref, greedy, timeout=60)).samples
        assert sample.completion_ids.tolist() == argmax_loop(
            reference.model, PROMPT, len(sample.completion_ids)
        )


async def test_a_version_arrives_by_gloo_broadcast(
    engine: EngineCore, reference: Checkpoint
) -> None:
    """The engine side of a weight group: join, receive a broadcast, apply it; a spec
    the model has no place for fails its call before any byte is received."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    address = GroupAddress("127.0.0.1", store.port, "solver/1", 2, "gloo", 30.0)
    weights = perturbed(reference, seed=5)
    version = engine.version + 1
    async with open_cluster("head", "gpu0") as (head, worker):
        await worker.spawn("engine/solver/0", lambda: EngineActor(engine))
        ref = await head.lookup("engine/solver/0", timeout=5)
        join = JoinWeightGroup("solver", address.name, "127.0.0.1", store.port, 1, 2, "gloo", 30.0)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(functools.partial(head.call, ref, join, timeout=60))
                group = await anyio.to_thread.run_sync(WeightGroup, address, 0, store)
            wrong = [TensorSpec("lm_head.weight", "float32", [1, 1])]
            with pytest.raises(RemoteError, match=r"lm_head\.weight"):
                await head.call(
                    ref, BroadcastWeights("solver", version, "solver/1", wrong, 1 << 20)
                )
            request = BroadcastWeights("solver", version, "solver/1", specs_of(weights), 64 << 10)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(functools.partial(head.call, ref, request, timeout=60))
                await anyio.to_thread.run_sync(group.send, weights, 64 << 10)
            group.close()
            greedy = Generate(
                "g", SamplingParams(temperature=0.0, max_tokens=12), prompt_ids=PROMPT
            )
            (sample,) = (await head.call(ref, greedy, timeout=60)).samples
    assert engine.version == version
    assert sample.versions.tolist() == [version] * len(sample.completion_ids)
    reference.model.load_state_dict(dict(weights))
    assert sample.completion_ids.tolist() == argmax_loop(
        reference.model, PROMPT, len(sample.completion_ids)
    )


async def test_stale_or_foreign_buckets_and_bad_requests_fail_their_call(
    engine: EngineCore, reference: Checkpoint
) -> None:
    async with open_cluster("head", "gpu0") as (head, worker):
        await worker.spawn("engine/solver/0", lambda: EngineActor(engine))
        ref = await head.lookup("engine/solver/0", timeout=5)
        updates = engine.statistics().updates
        named = list(reference.model.state_dict().items())[:1]
        with pytest.raises(RemoteError, match="not newer"):
            await push(head, ref, to_buckets("solver", engine.version, named))
        with pytest.raises(RemoteError, match="verifier"):
            await push(head, ref, to_buckets("verifier", engine.version + 1, named))
        with pytest.raises(RemoteError, match=r"sampling\.top_p"):
            await head.call(ref, Generate("x", SamplingParams(top_p=0.0), prompt_ids=PROMPT))
        stats = await head.call(ref, GetEngineStats(), timeout=5)
        assert stats.updates == updates


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
async def test_engine_node_process_serves_and_takes_weights(
    kind: str, tiny_path: Path, reference: Checkpoint
) -> None:
    async with open_node("head") as head:
        command = [sys.executable, "-m", "actors.engines.serve", "--head", head.address]
        command += ["--policy", "solver", "--model", str(tiny_path), "--engine", kind]
        command += ["--log-level", "warning"]
        async with await anyio.open_process(command, stderr=None) as process:
            assert process.stdout is not None and process.stdin is not None
            with anyio.fail_after(120):
                assert (await ready_line(process.stdout))["name"] == "engine/solver/0"
                ref = await head.lookup("engine/solver/0", timeout=30)
                weights = [(n, t * 0.5) for n, t in reference.model.state_dict().items()]
                assert (await push(head, ref, to_buckets("solver", 1, weights)))[-1]
                greedy = Generate(
                    "g", SamplingParams(temperature=0.0, max_tokens=8), prompt_ids=PROMPT
                )
                (sample,) = (await head.call(ref, greedy, timeout=60)).samples
            await process.stdin.aclose()
            with anyio.fail_after(30):
                assert await process.wait() == 0
    reference.model.load_state_dict(dict(weights))
    assert sample.versions.tolist() == [1] * len(sample.completion_ids)
    with torch.inference_mode():
        expected = argmax_loop(reference.model, PROMPT, len(sample.completion_ids))
    assert sample.completion_ids.tolist() == expected
