"""vLLM behind the engine interface.

vLLM is an asyncio program; the runtime's nodes run on trio. The boundary is one thread
that owns an asyncio event loop and vLLM's ``AsyncLLM``: every vLLM call is a coroutine
submitted to that loop, and its completion wakes the calling trio task through the trio
token, so neither loop ever blocks on the other. Cancelling the trio side cancels the
asyncio task, and vLLM aborts the request.

Weight updates pause generation with ``mode="keep"`` (running requests freeze and then
continue, on the new weights, over their KV cache), reload the weights in place in the
engine-core process from a safetensors file in shared memory (see ``vllm_worker``), set
vLLM's weight version and resume. vLLM
stamps every output token with the weight version that produced it; those stamps are
the sample's ``versions``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np
import sniffio
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer

from actors.engines.base import check_weights, request_prompt
from actors.messages import EngineStats, Generate, Sample, SampleTimings
from actors.models import check_checkpoint, parameter_shapes, render_chat

T = TypeVar("T")

# vLLM reads these at import; a caller's own settings win.
_ENVIRONMENT = {
    "VLLM_HOST_IP": "127.0.0.1",  # its internal sockets stay on loopback
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CONFIGURE_LOGGING": "0",  # its records go to the application's logging setup
    # vLLM compiles one sampler function even when eager; that cost 2-4 s on the first
    # request with logprobs here, for no measurable gain. The engine process compiles nothing.
    "TORCHDYNAMO_DISABLE": "1",
}
_WORKER_EXTENSION = "actors.engines.vllm_worker.WeightReceiver"
_SHARED_MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") else None


class _AsyncioThread:
    """An asyncio event loop in a thread of its own: the only place vLLM code runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="vllm-asyncio", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the asyncio loop and wait for it without blocking ours;
        if we are cancelled, it is cancelled too."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        done = anyio.Event()
        future.add_done_callback(_call_soon_threadsafe(done.set))
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    async def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        await anyio.to_thread.run_sync(self._thread.join)
        self.loop.close()


def _call_soon_threadsafe(callback: Callable[[], None]) -> Callable[[Any], None]:
    """A done-callback, callable from any thread, that runs ``callback`` in the event
    loop of the calling task (trio's or asyncio's)."""
    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def wake(_: Any) -> None:
            with suppress(trio.RunFinishedError):  # the node ended first
                token.run_sync_soon(callback)

        return wake
    loop = asyncio.get_running_loop()

    def wake_asyncio(_: Any) -> None:
        loop.call_soon_threadsafe(callback)

    return wake_asyncio


@dataclass(eq=False)
class _Row:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[Any] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    first_token: float = 0.0
    finished: float = 0.0


class VllmEngine:
    """Generation on vLLM's ``AsyncLLM``; use ``open_vllm_engine``."""

    kind = "vllm"

    def __init__(self, path: Path, *, policy: str, max_batch: int) -> None:
        self.path = path
        self.policy = policy
        self.max_batch = max_batch
        self.version = 0
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.vocab_size = int(config.vocab_size)
        self.max_positions = int(getattr(config, "max_position_embeddings", 2048))
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.shapes = parameter_shapes(path)
        self._thread = _AsyncioThread()
        self._llm: Any = None
        self._streams: set[asyncio.Task[Any]] = set()  # touched on the asyncio thread only
        self.cuda = torch.cuda.is_available()
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self._ids = itertools.count()
        self._running = self._tokens = self._updates = 0
        self._last_pause = 0.0
        self._updating = False

    async def start(self) -> None:
        for name, value in _ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        self._thread.start()
        self._llm = await self._thread.run(self._create())

    async def _create(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cuda = self.cuda
        arguments = AsyncEngineArgs(
            model=str(self.path),
            tokenizer=str(self.path),
            dtype=str(self.dtype).removeprefix("torch."),
            enforce_eager=not cuda,
            max_model_len=self.max_positions,
            max_num_seqs=self.max_batch,
            seed=0,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=_WORKER_EXTENSION,
            disable_log_stats=True,
            **({} if cuda else {"kv_cache_memory_bytes": 256 << 20}),
        )
        return AsyncLLM.from_engine_args(arguments)

    async def stop(self) -> None:
        if self._llm is not None:
            await self._thread.run(self._shutdown())
        await self._thread.stop()

    async def _shutdown(self) -> None:
        """Shut vLLM down from its own loop. Streams still open are cancelled first
        (vLLM aborts their requests; an open stream would wait forever), then whatever
        vLLM leaves behind once it is shut down."""
        streams = list(self._streams)
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        llm, self._llm = self._llm, None
        llm.shutdown()
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    # -- the interface --------------------------------------------------------------------

    async def generate(self, request: Generate) -> list[Sample]:
        prompt = request_prompt(
            request, partial(render_chat, self.tokenizer), self.vocab_size, self.max_positions
        )
        received = time.perf_counter()
        self._running += 1
        try:
            rows = await self._thread.run(
                self._generate(request, prompt, f"{request.request_id}#{next(self._ids)}")
            )
        finally:
            self._running -= 1
        return [self._to_sample(index, row, prompt, received) for index, row in enumerate(rows)]

    async def _generate(self, request: Generate, prompt: list[int], request_id: str) -> list[_Row]:
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        sampling = request.sampling
        params = VllmSampling(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
        )
        rows = [_Row() for _ in range(sampling.n)]
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            await self._stream(request_id, prompt, params, rows)
        finally:
            self._streams.discard(task)
        return rows

    async def _stream(
        self, request_id: str, prompt: list[int], params: Any, rows: list[_Row]
    ) -> None:
        from vllm.inputs import TokensPrompt

        stream = self._llm.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id
        )
        async with aclosing(stream):  # closed (and aborted) at once, not at collection
            await self._read(stream, rows)

    async def _read(self, stream: Any, rows: list[_Row]) -> None:
        async for output in stream:
            now = time.perf_counter()
            for completion in output.outputs:
                row = rows[completion.index]
                if completion.token_ids and not row.tokens:
                    row.first_token = now
                for token, logprobs in zip(
                    completion.token_ids, completion.logprobs or [], strict=True
                ):
                    row.tokens.append(int(token))
                    row.logprobs.append(float(logprobs[token].logprob))
                self._tokens += len(completion.token_ids)  # written by this thread alone
                row.text += completion.text
                row.spans = list(completion.weight_versions or row.spans)
                if completion.finish_reason is not None:
                    row.finish_reason, row.finished = str(completion.finish_reason), now

    async def update_weights(self, version: int, named: list[tuple[str, torch.Tensor]]) -> float:
        check_weights(named, self.shapes, self.policy)
        if self._updating:
            raise RuntimeError(f"engine {self.policy!r} is already applying a weight update")
        self._updating = True
        try:
            # vLLM's reload stops half-way on a dtype it does not hold, and the engine
            # dies at the next step: send its own dtype.
            tensors = {n: t.to(self.dtype).contiguous() for n, t in named}
            with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=_SHARED_MEMORY) as file:
                await anyio.to_thread.run_sync(save_file, tensors, file.name)
                pause = await self._thread.run(self._update(version, file.name))
        finally:
            self._updating = False
        self.version = version
        self._updates += 1
        self._last_pause = pause
        return pause

    async def _update(self, version: int, path: str) -> float:
        start = time.perf_counter()
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._llm.collective_rpc("relaytrain_load_weights", args=(path,))
            await self._llm.update_weight_version(str(version))
        finally:
            await self._llm.resume_generation()
        return time.perf_counter() - start

    def statistics(self) -> EngineStats:
        return EngineStats(
            policy=self.policy,
            engine=self.kind,
            version=self.version,
            running=self._running,
            waiting=0,
            generated_tokens=self._tokens,
            decode_steps=0,
            updates=self._updates,
            last_pause_s=self._last_pause,
        )

    def __repr__(self) -> str:
        return (
            f"<VllmEngine {self.policy} v{self.version} [requests {self._running} | "
            f"tokens {self._tokens} | updates {self._updates}]>"
        )

    def _to_sample(self, index: int, row: _Row, prompt: list[int], received: float) -> Sample:
        versions = np.zeros(len(row.tokens), dtype=np.int32)
        for span in row.spans:
            versions[span.start : span.end] = 0 if span.version == "default" else int(span.version)
        return Sample(
            index=index,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            completion_ids=np.asarray(row.tokens, dtype=np.int32),
            logprobs=np.asarray(row.logprobs, dtype=np.float32),
            versions=versions,
            finish_reason=row.finish_reason,
            text=row.text,
            timings=SampleTimings(
                queued=0.0,
                first_token=row.first_token - received,
                finished=row.finished - received,
            ),
        )


@asynccontextmanager
async def open_vllm_engine(
    path: str | Path, *, policy: str, max_batch: int = 64
) -> AsyncIterator[VllmEngine]:
    """Start vLLM on the checkpoint at ``path`` (about 10 s on CPU) for the block."""
    engine = VllmEngine(check_checkpoint(path), policy=policy, max_batch=max_batch)
    try:
        await engine.start()
        yield engine
    finally:
        with anyio.CancelScope(shield=True):
            await engine.stop()
