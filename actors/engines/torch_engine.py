"""The embedded engine: a transformers causal LM with continuous batching.

One loop task owns the model. Between two decode steps it applies a pending weight
update, admits waiting requests (their prompts are prefilled together, once per prompt
however many samples it asks for) and drops finished rows, so requests join and leave
the running batch at every step. The rows share one left-padded KV cache; each row's
positions count only its own tokens. Model calls run in a worker thread, so the node's
event loop keeps moving messages while torch computes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import numpy as np
import torch
from transformers import DynamicCache

from actors.engines.base import check_weights, request_prompt
from actors.messages import EngineStats, Generate, Sample, SampleTimings, SamplingParams
from actors.models import Checkpoint
from actors.sampling import processed_logprobs, sample

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class _Request:
    message: Generate
    prompt: list[int]
    received: float
    admitted: float = 0.0
    cancelled: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    rows: list[_Row] = field(default_factory=list)


@dataclass(eq=False)
class _Row:
    """One sample being generated."""

    request: _Request
    index: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str | None = None  # set when a stop string cut it
    finish_reason: str = ""
    first_token: float = 0.0
    finished: float = 0.0


class _Batch:
    """The running rows and their shared, left-padded KV cache."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.kv: KV = []
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.positions = torch.zeros(0, dtype=torch.long)
        self.last = torch.zeros(0, dtype=torch.long)

    def add(self, rows: list[_Row], kv: KV, mask: torch.Tensor, last: torch.Tensor) -> None:
        """Append rows whose prompts were prefilled into ``kv`` (same layout)."""
        positions = mask.sum(dim=1)
        if not self.rows:
            self.rows, self.kv, self.mask, self.positions, self.last = (
                rows,
                kv,
                mask,
                positions,
                last,
            )
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.kv = [
            (
                torch.cat([_pad_left(k, width), _pad_left(nk, width)]),
                torch.cat([_pad_left(v, width), _pad_left(nv, width)]),
            )
            for (k, v), (nk, nv) in zip(self.kv, kv, strict=True)
        ]
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.positions = torch.cat([self.positions, positions])
        self.last = torch.cat([self.last, last])
        self.rows = self.rows + rows

    def keep(self, keep: list[int]) -> None:
        """Keep only these rows, then cut the columns that are padding for all of them."""
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.kv, self.mask = [], torch.zeros(0, 0, dtype=torch.long)
            self.positions = self.last = torch.zeros(0, dtype=torch.long)
            return
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).nonzero()[0])
        self.mask = mask[:, start:]
        self.kv = [
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in self.kv
        ]
        self.positions = self.positions.index_select(0, index)
        self.last = self.last.index_select(0, index)


def _kv_of(cache: DynamicCache) -> KV:
    """Each layer's keys and values, ``[rows, kv_heads, positions, head_dim]``."""
    kv: KV = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(f"cache layer {type(layer).__name__} holds no key/value tensors")
        kv.append((keys, values))
    return kv


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence dimension (last for masks, third for KV) on the left."""
    dim = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class TorchEngine:
    """Continuous-batching generation over ``checkpoint.model``; use ``open_torch_engine``."""

    kind = "torch"

    def __init__(self, checkpoint: Checkpoint, *, policy: str, max_batch: int = 64) -> None:
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.tokenizer = checkpoint.tokenizer
        self.policy = policy
        self.max_batch = max_batch
        self.device = next(self.model.parameters()).device
        self.shapes = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        self.version = 0
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.max_positions = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.eos = (
            {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        )
        self._waiting: deque[_Request] = deque()
        self._batch = _Batch()
        self._update: tuple[int, list[tuple[str, torch.Tensor]], anyio.Event] | None = None
        self._update_result: float | BaseException = 0.0
        self._wake = anyio.Event()
        self._tokens = self._steps = self._updates = 0
        self._last_pause = 0.0

    # -- the interface agents and learners use ----------------------------------------

    async def generate(self, request: Generate) -> list[Sample]:
        prompt = request_prompt(
            request, self.checkpoint.render_chat, self.vocab_size, self.max_positions
        )
        pending = _Request(request, prompt, time.perf_counter())
        self._waiting.append(pending)
        self._wake.set()
        try:
            await pending.done.wait()
        except BaseException:
            pending.cancelled = True  # its rows leave the batch at the next step
            raise
        return [self._to_sample(pending, row) for row in pending.rows]

    async def update_weights(self, version: int, named: list[tuple[str, torch.Tensor]]) -> float:
        if self._update is not None:
            raise RuntimeError(
                f"engine {self.policy!r} is already applying version {self._update[0]}"
            )
        done = anyio.Event()
        self._update = (version, named, done)
        self._wake.set()
        await done.wait()
        result = self._update_result
        if isinstance(result, BaseException):
            raise result
        return result

    def statistics(self) -> EngineStats:
        return EngineStats(
            policy=self.policy,
            engine=self.kind,
            version=self.version,
            running=len(self._batch.rows),
            waiting=len(self._waiting),
            generated_tokens=self._tokens,
            decode_steps=self._steps,
            updates=self._updates,
            last_pause_s=self._last_pause,
        )

    def __repr__(self) -> str:
        return (
            f"<TorchEngine {self.policy} v{self.version} [running {len(self._batch.rows)} | "
            f"waiting {len(self._waiting)} | tokens {self._tokens} | steps {self._steps}]>"
        )

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Generate until cancelled: update, admit, step, retire, repeat."""
        while True:
            if self._update is None and not self._waiting and not self._batch.rows:
                await self._wake.wait()
            self._wake = anyio.Event()
            if self._update is not None:
                await self._apply_update()
            admitted = self._admit()
            if admitted:
                await anyio.to_thread.run_sync(self._prefill, admitted)
            elif self._batch.rows:
                await anyio.to_thread.run_sync(self._decode)
            self._retire()

    def _admit(self) -> list[_Request]:
        room = self.max_batch - len(self._batch.rows)
        admitted: list[_Request] = []
        while self._waiting and room > 0:
            pending = self._waiting[0]
            n = pending.message.sampling.n
            if n > room and (self._batch.rows or admitted):
                break  # wait for rows to leave rather than split one request's samples
            self._waiting.popleft()
            if pending.cancelled:
                continue
            pending.admitted = time.perf_counter()
            seed = pending.message.sampling.seed
            for index in range(n):
                generator = None
                if seed is not None:
                    generator = torch.Generator(self.device).manual_seed(seed * 1_000_003 + index)
                pending.rows.append(_Row(pending, index, generator))
            admitted.append(pending)
            room -= n
        return admitted

    @torch.inference_mode()
    def _prefill(self, admitted: list[_Request]) -> None:
        width = max(len(p.prompt) for p in admitted)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(admitted), width), pad, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(admitted), width), dtype=torch.long, device=self.device)
        for i, pending in enumerate(admitted):
            ids[i, width - len(pending.prompt) :] = torch.tensor(pending.prompt, device=self.device)
            mask[i, width - len(pending.prompt) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=None if bool(mask.all()) else mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=1,
            use_cache=True,
        )
        repeats = torch.tensor([p.message.sampling.n for p in admitted], device=self.device)
        kv = [
            (k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0))
            for k, v in _kv_of(cache)
        ]
        logits = out.logits[:, -1].repeat_interleave(repeats, dim=0)
        rows = [row for pending in admitted for row in pending.rows]
        tokens = self._sample(rows, logits)
        self._batch.add(rows, kv, mask.repeat_interleave(repeats, dim=0), tokens)

    @torch.inference_mode()
    def _decode(self) -> None:
        batch = self._batch
        ones = torch.ones(len(batch.rows), 1, dtype=torch.long, device=self.device)
        mask = torch.cat([batch.mask, ones], dim=1)
        cache = DynamicCache(ddp_cache_data=batch.kv)
        out = self.model(
            input_ids=batch.last.unsqueeze(1),
            # Without padding the mask says nothing, and attention runs faster without one.
            attention_mask=None if bool(batch.mask.all()) else mask,
            position_ids=batch.positions.unsqueeze(1),
            past_key_values=cache,
            logits_to_keep=1,
            use_cache=True,
        )
        batch.kv = _kv_of(cache)
        batch.mask = mask
        batch.positions = batch.positions + 1
        batch.last = self._sample(batch.rows, out.logits[:, -1])
        self._steps += 1

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        """Sample one token per row, record it, and return the tokens to feed next."""
        params = [row.request.message.sampling for row in rows]
        temperature = torch.tensor([p.temperature for p in params], device=self.device)
        logprobs = processed_logprobs(
            logits,
            temperature,
            torch.tensor([p.top_k for p in params], device=self.device),
            torch.tensor([p.top_p for p in params], device=self.device),
        )
        tokens = sample(logprobs, temperature, [row.generator for row in rows])
        chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        now = time.perf_counter()
        for row, token, logprob, p in zip(
            rows, tokens.tolist(), chosen.tolist(), params, strict=True
        ):
            if not row.tokens:
                row.first_token = now
            row.tokens.append(token)
            row.logprobs.append(logprob)
            row.versions.append(self.version)
            self._finish_if_done(row, token, p)
        self._tokens += len(rows)
        return tokens

    def _finish_if_done(self, row: _Row, token: int, sampling: SamplingParams) -> None:
        stop, max_tokens = sampling.stop, sampling.max_tokens
        if token in self.eos and not sampling.ignore_eos:
            row.finish_reason = "stop"
        elif stop:
            text = self._text(row.tokens)
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
            if cut >= 0:
                row.finish_reason, row.text = "stop", text[:cut]
        if not row.finish_reason and (
            len(row.tokens) >= max_tokens
            or len(row.request.prompt) + len(row.tokens) >= self.max_positions
        ):
            row.finish_reason = "length"
        if row.finish_reason:
            row.finished = time.perf_counter()

    def _retire(self) -> None:
        """Drop finished rows and rows of cancelled requests; wake finished requests."""
        keep = []
        for i, row in enumerate(self._batch.rows):
            if not row.finish_reason and not row.request.cancelled:
                keep.append(i)
        ended = {row.request for row in self._batch.rows} - {
            self._batch.rows[i].request for i in keep
        }
        self._batch.keep(keep)
        for pending in ended:
            if all(row.finish_reason for row in pending.rows) or pending.cancelled:
                pending.done.set()

    async def _apply_update(self) -> None:
        assert self._update is not None
        version, named, done = self._update
        start = time.perf_counter()
        try:
            await anyio.to_thread.run_sync(self._load, named)
        except BaseException as error:
            self._update_result = error
        else:
            self.version = version
            self._updates += 1
            self._last_pause = self._update_result = time.perf_counter() - start
        finally:
            self._update = None
            done.set()

    @torch.inference_mode()
    def _load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Copy the tensors into the model's parameters, all or nothing."""
        state = self.model.state_dict(keep_vars=True)
        check_weights(named, self.shapes, self.policy)
        for name, tensor in named:
            state[name].data.copy_(tensor)

    def _text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def _to_sample(self, pending: _Request, row: _Row) -> Sample:
        text = self._text(row.tokens) if row.text is None else row.text
        return Sample(
            index=row.index,
            prompt_ids=np.asarray(pending.prompt, dtype=np.int32),
            completion_ids=np.asarray(row.tokens, dtype=np.int32),
            logprobs=np.asarray(row.logprobs, dtype=np.float32),
            versions=np.asarray(row.versions, dtype=np.int32),
            finish_reason=row.finish_reason,
            text=text,
            timings=SampleTimings(
                queued=pending.admitted - pending.received,
                first_token=row.first_token - pending.received,
                finished=row.finished - pending.received,
            ),
        )


@asynccontextmanager
async def open_torch_engine(
    checkpoint: Checkpoint, *, policy: str, max_batch: int = 64
) -> AsyncIterator[TorchEngine]:
    """Run a torch engine's loop for the duration of the block."""
    engine = TorchEngine(checkpoint, policy=policy, max_batch=max_batch)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(engine.run)
        try:
            yield engine
        finally:
            tasks.cancel_scope.cancel()
