"""Engines suite: generation throughput of each engine against plain ``model.generate``
of the same model, and the cost of a weight update.

* **static**: ``prompts`` prompts of 16 tokens, ``new_tokens`` sampled tokens each
  (temperature 1, end-of-sequence ignored, so every side makes the same tokens). HF
  ``generate`` gets them as one batch; an engine gets them as concurrent requests.
* **streaming**: requests of mixed lengths (log-uniform 4..128 new tokens) arrive at
  exponential intervals. Static batching (HF ``generate`` on batches of 16 in arrival
  order, each batch as long as its longest request) against the engine's continuous
  batching. Throughput counts requested tokens over the makespan.
* **weight update**: perturbed weights pushed as buckets through an engine actor on
  another node over tcp while a generation runs: time until applied, and the pause.

Models: the tiny test model and a ~120M-parameter one of the same family (Qwen2.5-0.5B
width, 8 layers), built here. One torch thread everywhere. Every figure is a median
over repetitions; HF and engine repetitions alternate.
"""

from __future__ import annotations

import importlib.util
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from actors.engines import EngineActor, EngineCore, open_torch_engine, to_buckets
from actors.messages import Generate, SamplingParams
from actors.models import Checkpoint, load_checkpoint
from actors.tiny_model import build_tiny_checkpoint
from benchmarks.harness import Figure, write_json
from runtime import open_node

MODELS: dict[str, dict[str, int]] = {
    "tiny": {},
    "120m": {
        "hidden_size": 896,
        "layers": 8,
        "heads": 14,
        "kv_heads": 2,
        "intermediate_size": 4864,
    },
}
FULL: dict[str, Any] = {
    "models": ["tiny", "120m"],
    "reps": 3,
    "prompts": 64,
    "new_tokens": 32,
    "stream": {"tiny": (64, 0.01), "120m": (32, 0.2)},  # requests, mean gap (s)
}
QUICK: dict[str, Any] = {
    "models": ["tiny"],
    "reps": 1,
    "prompts": 8,
    "new_tokens": 8,
    "stream": {"tiny": (8, 0.01)},
}
STATIC_BATCH = 16
PROMPT_TOKENS = 16


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(32, 127) for _ in range(PROMPT_TOKENS)] for _ in range(count)]


def _hf_generate(checkpoint: Checkpoint, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for ``model.generate`` to sample ``new_tokens`` for every prompt at once."""
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    with torch.inference_mode():
        checkpoint.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=checkpoint.tokenizer.pad_token_id,
        )
    return time.perf_counter() - start


async def _engine_generate(engine: EngineCore, prompts: list[list[int]], new_tokens: int) -> float:
    sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for i, prompt in enumerate(prompts):
            request = Generate(f"s{i}", sampling, prompt_ids=np.array(prompt, dtype=np.int32))
            tasks.start_soon(engine.generate, request)
    return time.perf_counter() - start


def _workload(requests: int, gap: float, seed: int) -> list[tuple[float, list[int], int]]:
    """(arrival second, prompt, new tokens) per request."""
    rng = random.Random(seed)
    arrival, out = 0.0, []
    for prompt in _prompts(requests, seed):
        out.append((arrival, prompt, round(math.exp(rng.uniform(math.log(4), math.log(128))))))
        arrival += rng.expovariate(1 / gap)
    return out


def _static_batching(checkpoint: Checkpoint, workload: list[tuple[float, list[int], int]]) -> float:
    """Makespan of HF generate on batches in arrival order (simulated arrivals: a batch
    starts once its last request has arrived and the previous batch has finished)."""
    clock = 0.0
    for first in range(0, len(workload), STATIC_BATCH):
        batch = workload[first : first + STATIC_BATCH]
        clock = max(clock, batch[-1][0])
        clock += _hf_generate(checkpoint, [p for _, p, _ in batch], max(n for _, _, n in batch))
    return clock


async def _continuous_batching(
    engine: EngineCore, workload: list[tuple[float, list[int], int]]
) -> float:
    start = time.perf_counter()

    async def submit(i: int, arrival: float, prompt: list[int], new_tokens: int) -> None:
        await anyio.sleep(max(0.0, start + arrival - time.perf_counter()))
        sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
        await engine.generate(Generate(f"w{i}", sampling, prompt_ids=np.array(prompt, np.int32)))

    async with anyio.create_task_group() as tasks:
        for i, (arrival, prompt, new_tokens) in enumerate(workload):
            tasks.start_soon(submit, i, arrival, prompt, new_tokens)
    return time.perf_counter() - start


async def _weight_update(
    engine: EngineCore, checkpoint: Checkpoint, version: int
) -> tuple[float, float]:
    """Push perturbed weights over tcp while generating; (seconds until applied, pause)."""
    named = [(n, t + 0.01) for n, t in checkpoint.model.state_dict().items()]
    async with open_node("learner") as learner, open_node("engine", head=learner.address) as node:
        await node.spawn("engine/bench/0", lambda: EngineActor(engine))
        ref = await learner.lookup("engine/bench/0", timeout=30)
        buckets = to_buckets("bench", version, named)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_engine_generate, engine, _prompts(8, 1), 64)
            await anyio.sleep(0.05)
            start = time.perf_counter()
            for bucket in buckets:
                applied = await learner.call(ref, bucket, timeout=600)
            elapsed = time.perf_counter() - start
    return elapsed, applied.pause_s


def _open_engine(kind: str, path: Path) -> Any:
    if kind == "torch":
        return open_torch_engine(load_checkpoint(path), policy="bench", max_batch=64)
    from actors.engines.vllm_engine import open_vllm_engine

    return open_vllm_engine(path, policy="bench", max_batch=64)


async def _measure(
    model: str, path: Path, plan: dict[str, Any], kinds: list[str]
) -> dict[str, Any]:
    checkpoint = load_checkpoint(path)
    prompts = _prompts(plan["prompts"], seed=0)
    tokens = len(prompts) * plan["new_tokens"]
    requests, gap = plan["stream"][model]
    workload = _workload(requests, gap, seed=1)
    useful = sum(n for _, _, n in workload)
    result: dict[str, Any] = {"model": model, "parameters": checkpoint.model.num_parameters()}
    _hf_generate(checkpoint, prompts[:4], 4)  # warm-up
    for kind in kinds:
        figures: dict[str, list[float]] = {}
        async with _open_engine(kind, path) as engine:
            await _engine_generate(engine, prompts[:4], 4)  # warm-up
            for _ in range(plan["reps"]):
                hf_static = tokens / await anyio.to_thread.run_sync(
                    _hf_generate, checkpoint, prompts, plan["new_tokens"]
                )
                static = tokens / await _engine_generate(engine, prompts, plan["new_tokens"])
                hf_stream = useful / await anyio.to_thread.run_sync(
                    _static_batching, checkpoint, workload
                )
                stream = useful / await _continuous_batching(engine, workload)
                update, pause = await _weight_update(engine, checkpoint, engine.version + 1)
                for name, value in (
                    ("static_tok_s", static),
                    ("hf_static_tok_s", hf_static),
                    ("static_ratio", static / hf_static),
                    ("stream_tok_s", stream),
                    ("hf_stream_tok_s", hf_stream),
                    ("stream_ratio", stream / hf_stream),
                    ("update_s", update),
                    ("pause_s", pause),
                ):
                    figures.setdefault(name, []).append(value)
        result[kind] = {name: Figure.of(values).as_dict() for name, values in figures.items()}
    return result


def run(quick: bool, out: Path) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    torch.set_num_threads(1)
    kinds = ["torch"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="engines-bench-") as tmp:
        for model in plan["models"]:
            path = build_tiny_checkpoint(Path(tmp) / model, **MODELS[model])  # type: ignore[arg-type]
            rows.append(anyio.run(_measure, model, path, plan, kinds, backend="trio"))
    result = {"quick": quick, "reps": plan["reps"], "engines": kinds, "rows": rows}
    write_json(out, "engines", result)
    print_table(result)
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"engines suite: median of {result['reps']} repetitions, tokens/s, 1 torch thread"
        f"{' (quick: too short to read speed from)' if result['quick'] else ''}"
    )
    print(
        f"{'model':<6} {'engine':<7} {'static':>8} {'HF':>8} {'ratio':>6} "
        f"{'stream':>8} {'HF batched':>11} {'ratio':>6} {'update s':>9} {'pause s':>8}"
    )
    for row in result["rows"]:
        for kind in result["engines"]:
            f = {name: figure["median"] for name, figure in row[kind].items()}
            print(
                f"{row['model']:<6} {kind:<7} {f['static_tok_s']:>8,.0f} "
                f"{f['hf_static_tok_s']:>8,.0f} {f['static_ratio']:>6.2f} "
                f"{f['stream_tok_s']:>8,.0f} {f['hf_stream_tok_s']:>11,.0f} "
                f"{f['stream_ratio']:>6.2f} {f['update_s']:>9.3f} {f['pause_s']:>8.3f}"
            )
