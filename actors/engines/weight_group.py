"""Weight publication over a torch.distributed group: one learner (rank 0) broadcasts a
version to all its engines (ranks 1..n) with gloo on CPU or NCCL on GPU.

The group is built from a ``TCPStore`` that the learner serves and a process group
constructed directly on it, not through ``init_process_group``: a process may belong to
several such groups (and vLLM's worker already owns the default one). Every step has a
timeout: joining waits at most ``timeout`` for all ranks, and every broadcast is waited
on with it, so a dead engine turns into an error, never a hang. A group that failed once
is closed; the learner builds a fresh one for its next version.

Tensors travel packed: each bucket of about ``bucket_bytes`` is one flat byte buffer
and one collective, laid out by ``bucket_layout`` from the specs both sides hold.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from actors.engines.weights import DTYPES
from actors.messages import TensorSpec

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class GroupAddress:
    host: str
    port: int
    name: str
    world_size: int
    backend: str
    timeout_s: float


class WeightGroup:
    """One member of a weight-publication group; blocking calls, run them in a thread."""

    def __init__(self, address: GroupAddress, rank: int, store: dist.Store | None = None) -> None:
        if address.backend not in BACKENDS:
            raise ValueError(
                f"weight group backend must be one of {BACKENDS}, got {address.backend!r}"
            )
        if not 0 <= rank < address.world_size:
            raise ValueError(f"rank {rank} is outside 0..{address.world_size - 1}")
        self.address = address
        self.rank = rank
        self.timeout = datetime.timedelta(seconds=address.timeout_s)
        self.device = torch.device("cuda") if address.backend == "nccl" else torch.device("cpu")
        if store is None:
            store = dist.TCPStore(
                address.host,
                address.port,
                address.world_size,
                is_master=False,
                timeout=self.timeout,
            )
        prefixed = dist.PrefixStore(address.name, store)
        if address.backend == "gloo":
            self._group: Any = dist.ProcessGroupGloo(
                prefixed, rank, address.world_size, self.timeout
            )
        else:
            nccl = getattr(dist, "ProcessGroupNCCL", None)
            if nccl is None:
                raise RuntimeError("weight group backend 'nccl' needs a CUDA build of torch")
            options = nccl.Options()
            options._timeout = self.timeout
            self._group = nccl(prefixed, rank, address.world_size, options)

    def send(self, named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> None:
        """Broadcast ``named`` from rank 0, bucket by bucket."""
        specs = specs_of(named)
        for bucket in bucket_layout(specs, bucket_bytes):
            flat = torch.cat(
                [
                    named[i][1].detach().to(self.device).contiguous().reshape(-1).view(torch.uint8)
                    for i in bucket
                ]
            )
            self._broadcast(flat)

    def receive(
        self, specs: Sequence[TensorSpec], bucket_bytes: int
    ) -> list[tuple[str, torch.Tensor]]:
        """The tensors rank 0 broadcasts for ``specs``, as views of the received buffers."""
        received: list[tuple[str, torch.Tensor]] = []
        for bucket in bucket_layout(specs, bucket_bytes):
            flat = torch.empty(
                sum(nbytes(specs[i]) for i in bucket), dtype=torch.uint8, device=self.device
            )
            self._broadcast(flat)
            offset = 0
            for i in bucket:
                spec = specs[i]
                size = nbytes(spec)
                tensor = flat[offset : offset + size].view(DTYPES[spec.dtype]).reshape(spec.shape)
                received.append((spec.name, tensor))
                offset += size
        return received

    def _broadcast(self, flat: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        work = self._group.broadcast([flat], options)
        if not work.wait(self.timeout):
            raise TimeoutError(
                f"weight group {self.address.name!r}: broadcast not done within "
                f"{self.address.timeout_s} s"
            )

    def close(self) -> None:
        """Abort the group: a member still blocked in a collective fails at once."""
        self._group.abort()


def specs_of(named: Sequence[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    specs = []
    for name, tensor in named:
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise TypeError(f"weight {name!r} has dtype {tensor.dtype}, which cannot travel")
        specs.append(TensorSpec(name, dtype, list(tensor.shape)))
    return specs


def check_specs(
    specs: Sequence[TensorSpec], shapes: dict[str, tuple[int, ...]], policy: str
) -> None:
    """Raise ValueError naming the first spec the model has no place for, before any
    byte is received."""
    for spec in specs:
        if spec.dtype not in DTYPES:
            raise ValueError(f"weight {spec.name!r}: unknown dtype {spec.dtype!r}")
        expected = shapes.get(spec.name)
        if expected is None:
            raise ValueError(f"weight {spec.name!r} is not a parameter of the {policy!r} model")
        if tuple(spec.shape) != expected:
            raise ValueError(
                f"weight {spec.name!r} has shape {spec.shape}, the model's is {list(expected)}"
            )


def nbytes(spec: TensorSpec) -> int:
    count = int(np.prod(spec.shape, dtype=np.int64))
    return count * torch.empty((), dtype=DTYPES[spec.dtype]).element_size()


def bucket_layout(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``specs`` in consecutive buckets of about ``bucket_bytes`` (a tensor
    larger than that gets a bucket of its own); both ends compute the same layout."""
    buckets: list[list[int]] = []
    size = 0
    for index, spec in enumerate(specs):
        n = nbytes(spec)
        if not buckets or (buckets[-1] and size + n > bucket_bytes):
            buckets.append([])
            size = 0
        buckets[-1].append(index)
        size += n
    return buckets
