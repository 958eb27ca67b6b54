"""Atomic training checkpoints: a checkpoint directory is complete or absent.

A checkpoint holds the weights (safetensors), the optimizer state, every random number
generator the learner draws from, the policy version, the step, the ids of every
segment trained on and the accepted segments not trained on yet (see ``segment_log``),
so a resumed run continues from the same version without training a segment twice or
losing one. It is written into a temporary directory beside its final
name, flushed to disk, then renamed: a crash leaves either the previous checkpoints or
a temporary directory that ``latest_checkpoint`` ignores.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from actors.messages import ScoredSegment
from learner.segment_log import read_segments, write_segments

_META = "meta.json"
_HELD = "held.log"
_PREFIX = "step-"


@dataclass(frozen=True)
class TrainingState:
    """What a checkpoint restores besides the weights and optimizer."""

    version: int
    step: int
    consumed: frozenset[str]
    held: list[ScoredSegment]


def write_checkpoint(
    root: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    version: int,
    step: int,
    consumed: Iterable[str],
    held: Iterable[ScoredSegment] = (),
    keep: int = 3,
) -> Path:
    """Write checkpoint ``step`` under ``root`` and keep only the ``keep`` newest."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:09d}"
    if final.exists():
        raise FileExistsError(f"checkpoint {final} already exists")
    temporary = root / f".{final.name}.{uuid.uuid4().hex}.tmp"
    temporary.mkdir()
    try:
        save_model(model, str(temporary / "model.safetensors"))
        torch.save(optimizer.state_dict(), temporary / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, temporary / "rng.pt")
        write_segments(temporary / _HELD, held)
        meta = {
            "version": version,
            "step": step,
            "consumed": sorted(consumed),
            "python_rng": _jsonable(random.getstate()),
            "numpy_rng": np.random.get_state(legacy=False),
        }
        (temporary / _META).write_text(json.dumps(meta, default=_json_default))
        for path in temporary.iterdir():
            _fsync(path)
        _fsync(temporary)
        os.rename(temporary, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    for old in sorted(complete_checkpoints(root))[:-keep]:
        shutil.rmtree(old)
    return final


def complete_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / _META).is_file())


def latest_checkpoint(root: str | Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def read_checkpoint(
    path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> TrainingState:
    """Restore weights, optimizer and random state from ``path``; returns the rest."""
    path = Path(path)
    meta = json.loads((path / _META).read_text())
    load_model(model, str(path / "model.safetensors"))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
    random.setstate(_python_state(meta["python_rng"]))
    np.random.set_state(meta["numpy_rng"])
    records = read_segments(path / _HELD) if (path / _HELD).is_file() else []
    held = [record for record in records if isinstance(record, ScoredSegment)]
    return TrainingState(meta["version"], meta["step"], frozenset(meta["consumed"]), held)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(state: Any) -> Any:
    return [_jsonable(x) for x in state] if isinstance(state, tuple | list) else state


def _python_state(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"cannot write {type(value).__name__} into a checkpoint's meta.json")
