"""Learner suite: what the learner's machinery costs over a plain training loop, and
weight publication against the raw transport bound.

* **step**: the same model and the same batches (64 segments in GRPO groups of 8,
  16-token prompts, 32-token completions) trained by ``Trainer.train`` and by a plain
  loop (one padded forward, log-softmax, policy-gradient loss, backward, AdamW step);
  repetitions alternate. Overhead = plain tokens/s over learner tokens/s, minus 1.
* **publish**: a learner node publishes its weights to a torch engine in an engine node
  process until the engine applied them, once as bucket messages over tcp and once as a
  gloo broadcast (``sync_backend``); the raw bound is the same bytes pushed by blocking
  pyzmq PUSH/PULL between the same two kinds of process.

Models: the tiny test model and a ~100M-parameter one (Qwen2, hidden 768, 8 layers).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch
import zmq

from actors.messages import SamplingParams, ScoredSegment, Segment
from actors.models import load_checkpoint
from actors.tiny_model import build_tiny_checkpoint
from benchmarks.harness import Figure, write_json
from learner.actor import LearnerActor
from learner.trainer import LearnerConfig, Trainer
from runtime import open_node

MODELS: dict[str, dict[str, int]] = {
    "tiny": {},
    "100m": {
        "hidden_size": 768,
        "layers": 8,
        "heads": 12,
        "kv_heads": 4,
        "intermediate_size": 3072,
    },
}
FULL: dict[str, Any] = {"models": ["tiny", "100m"], "reps": 3, "segments": 64}
QUICK: dict[str, Any] = {"models": ["tiny"], "reps": 1, "segments": 16}
GROUP = 8
PROMPT, COMPLETION = 16, 32


def _batch(count: int, seed: int, vocab: int) -> list[ScoredSegment]:
    rng = np.random.default_rng(seed)
    batch = []
    for i in range(count):
        segment = Segment(
            segment_id=f"{seed}-{i}",
            episode_id=f"{seed}-{i // GROUP}",
            sample_id=f"{seed}-{i}",
            parent_id="",
            group=f"{seed}-{i // GROUP}",
            group_size=GROUP,
            role="solver",
            policy="bench",
            prompt_ids=rng.integers(0, vocab, PROMPT, dtype=np.int32),
            completion_ids=rng.integers(0, vocab, COMPLETION, dtype=np.int32),
            logprobs=np.full(COMPLETION, -5.0, dtype=np.float32),
            versions=np.zeros(COMPLETION, dtype=np.int32),
            finish_reason="length",
            sampling=SamplingParams(),
        )
        batch.append(ScoredSegment(segment, float(rng.random())))
    return batch


def _plain_step(model: Any, optimizer: torch.optim.Optimizer, batch: list[ScoredSegment]) -> float:
    """The baseline: what any training loop does for this batch, and nothing more."""
    start = time.perf_counter()
    ids = torch.tensor(
        np.stack([np.concatenate([s.segment.prompt_ids, s.segment.completion_ids]) for s in batch]),
        dtype=torch.long,
    )
    rewards = torch.tensor([s.reward for s in batch])
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits[:, PROMPT - 1 : -1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(2, ids[:, PROMPT:, None])[..., 0]
    loss = -(logprobs * advantages[:, None]).mean()
    torch.autograd.backward(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return len(batch) * COMPLETION / (time.perf_counter() - start)


def _learner_step(trainer: Trainer, batch: list[ScoredSegment]) -> float:
    start = time.perf_counter()
    ready = None
    for scored in batch:
        ready = trainer.admit(scored) or ready
    assert ready is not None, "the batch did not complete"
    trainer.train(ready)
    return len(batch) * COMPLETION / (time.perf_counter() - start)


def _steps(path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    config = LearnerConfig(
        policy="bench", groups_per_batch=plan["segments"] // GROUP, max_staleness=1 << 30
    )
    trainer = Trainer(load_checkpoint(path).model, config)
    plain_model = load_checkpoint(path).model
    optimizer = torch.optim.AdamW(plain_model.parameters(), lr=config.lr)
    vocab = trainer.vocab_size
    _plain_step(plain_model, optimizer, _batch(plan["segments"], 0, vocab))  # warm-up
    _learner_step(trainer, _batch(plan["segments"], 0, vocab))
    mine, plain = [], []
    for rep in range(1, plan["reps"] + 1):
        batch = _batch(plan["segments"], rep, vocab)
        plain.append(_plain_step(plain_model, optimizer, batch))
        mine.append(_learner_step(trainer, batch))
    return {
        "learner_tok_s": Figure.of(mine).as_dict(),
        "plain_tok_s": Figure.of(plain).as_dict(),
        "overhead": Figure.of([p / m - 1 for m, p in zip(mine, plain, strict=True)]).as_dict(),
    }


async def _publish(path: Path, plan: dict[str, Any], backend: str) -> list[float]:
    model = load_checkpoint(path).model
    config = LearnerConfig(policy="bench", engines=["engine/bench/0"], sync_backend=backend)  # type: ignore[arg-type]
    seconds = []
    async with open_node("learner") as node:
        command = [sys.executable, "-m", "actors.engines.serve", "--head", node.address]
        command += ["--policy", "bench", "--model", str(path), "--log-level", "warning"]
        async with await anyio.open_process(command, stderr=None) as process:
            assert process.stdout is not None and process.stdin is not None
            await node.lookup("engine/bench/0", timeout=120)
            learner = LearnerActor(model, config)
            await node.spawn("learner/bench", lambda: learner)
            for _ in range(plan["reps"] + 1):
                learner.trainer.version += 1
                start = time.perf_counter()
                await learner.publish()
                seconds.append(time.perf_counter() - start)
                if learner.published != learner.trainer.version:
                    raise RuntimeError("the engine did not apply the published weights")
            await process.stdin.aclose()
            await process.wait()
    return seconds[1:]


def _publication(path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Both publication paths and the raw bound; the first repetition of each warms up."""
    tensors = load_checkpoint(path).model.state_dict().values()
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    messages = anyio.run(_publish, path, plan, "messages", backend="trio")
    gloo = anyio.run(_publish, path, plan, "gloo", backend="trio")
    raw = _raw_seconds(nbytes, plan["reps"] + 1)[1:]
    return {
        "bytes": nbytes,
        "publish_s": Figure.of(messages).as_dict(),
        "gloo_s": Figure.of(gloo).as_dict(),
        "raw_s": Figure.of(raw).as_dict(),
        "ratio": Figure.of([s / r for s, r in zip(messages, raw, strict=True)]).as_dict(),
        "gloo_ratio": Figure.of([s / r for s, r in zip(gloo, raw, strict=True)]).as_dict(),
    }


def _raw_seconds(nbytes: int, reps: int) -> list[float]:
    """Seconds for blocking pyzmq to push ``nbytes`` in 64 MiB frames to another process
    over tcp and hear back that all arrived."""
    peer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.runtime_peer", "raw", "--transport", "tcp"],
        stdout=subprocess.PIPE,
    )
    assert peer.stdout is not None
    addresses = json.loads(peer.stdout.readline())
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    push.connect(addresses["pull"])
    pull.connect(addresses["push"])
    chunk = bytearray(64 << 20)
    frames = [
        memoryview(chunk)[: min(len(chunk), nbytes - i)] for i in range(0, nbytes, len(chunk))
    ]
    seconds = []
    try:
        for _ in range(reps):
            start = time.perf_counter()
            for frame in frames:
                push.send(frame, 0, False)
            push.send(b"END")
            pull.recv()
            seconds.append(time.perf_counter() - start)
        push.send(b"STOP")
    finally:
        peer.wait(timeout=30)
        context.destroy(linger=0)
    return seconds


def run(quick: bool, out: Path) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="learner-bench-") as tmp:
        for model in plan["models"]:
            path = build_tiny_checkpoint(Path(tmp) / model, **MODELS[model])  # type: ignore[arg-type]
            row = {"model": model, "step": _steps(path, plan)}
            row["publish"] = _publication(path, plan)
            rows.append(row)
    result = {"quick": quick, "reps": plan["reps"], "rows": rows}
    write_json(out, "learner", result)
    print_table(result)
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"learner suite: median of {result['reps']} repetitions, 1 torch thread"
        f"{' (quick: too short to read speed from)' if result['quick'] else ''}"
    )
    print(
        f"{'model':<6} {'learner tok/s':>14} {'plain tok/s':>12} {'overhead':>9} "
        f"{'MB':>7} {'raw s':>7} {'messages s':>11} {'ratio':>6} {'gloo s':>7} {'ratio':>6}"
    )
    for row in result["rows"]:
        step, publish = row["step"], row["publish"]
        print(
            f"{row['model']:<6} {step['learner_tok_s']['median']:>14,.0f} "
            f"{step['plain_tok_s']['median']:>12,.0f} {step['overhead']['median']:>8.1%} "
            f"{publish['bytes'] / 1e6:>7.1f} {publish['raw_s']['median']:>7.3f} "
            f"{publish['publish_s']['median']:>11.3f} {publish['ratio']['median']:>6.2f} "
            f"{publish['gloo_s']['median']:>7.3f} {publish['gloo_ratio']['median']:>6.2f}"
        )
