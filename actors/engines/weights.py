"""Named tensors as weight buckets: raw bytes in ``Blob`` frames, with dtype and shape
beside them, so a weight update travels as ordinary runtime messages (zero-copy above
~64 KiB) and never through files or pickle."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from actors.messages import WeightBucket
from runtime import Blob

DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64)
}


def to_buckets(
    policy: str,
    version: int,
    named: Iterable[tuple[str, torch.Tensor]],
    *,
    bucket_bytes: int = 64 << 20,
) -> list[WeightBucket]:
    """Split the tensors into buckets of about ``bucket_bytes`` (a tensor larger than
    that gets a bucket of its own). The tensors' storage is shared, not copied, for
    contiguous CPU tensors: keep them unchanged until the buckets are acknowledged."""
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in named:
        tensor = tensor.detach().to("cpu").contiguous()
        if str(tensor.dtype).removeprefix("torch.") not in DTYPES:
            raise TypeError(f"weight {name!r} has dtype {tensor.dtype}, which cannot travel")
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, tensor))
        size += nbytes
    count = len(groups)
    return [
        WeightBucket(
            policy=policy,
            version=version,
            index=index,
            count=count,
            names=[name for name, _ in group],
            dtypes=[str(t.dtype).removeprefix("torch.") for _, t in group],
            shapes=[list(t.shape) for _, t in group],
            data=[Blob(_bytes_of(t)) for _, t in group],
        )
        for index, group in enumerate(groups)
    ]


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    flat: np.ndarray = tensor.reshape(-1).view(torch.uint8).numpy()
    return flat.data.cast("B")


def from_bucket(bucket: WeightBucket) -> Iterator[tuple[str, torch.Tensor]]:
    """The bucket's tensors, as views of its frames; raises ValueError naming the
    tensor whose dtype, shape or byte count is wrong."""
    fields = (bucket.names, bucket.dtypes, bucket.shapes, bucket.data)
    if len({len(field) for field in fields}) != 1:
        raise ValueError(
            f"WeightBucket {bucket.index}/{bucket.count} of version {bucket.version}: "
            f"names, dtypes, shapes and data differ in length ({[len(f) for f in fields]})"
        )
    for name, dtype_name, shape, blob in zip(*fields, strict=True):
        dtype = DTYPES.get(dtype_name)
        if dtype is None:
            raise ValueError(f"weight {name!r}: unknown dtype {dtype_name!r}")
        expected = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if len(blob) != expected or min(shape, default=0) < 0:
            raise ValueError(
                f"weight {name!r}: {len(blob)} bytes cannot hold shape {shape} of {dtype_name}"
            )
        if expected == 0:
            yield name, torch.empty(shape, dtype=dtype)
            continue
        with warnings.catch_warnings():
            # Frames off the wire are read-only; the tensor is only ever read from.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            raw = torch.frombuffer(blob.view, dtype=torch.uint8)
        yield name, raw.view(dtype).reshape(shape)
