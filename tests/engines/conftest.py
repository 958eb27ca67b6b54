"""Engines under test, built on one tiny checkpoint per session. Each engine kind runs
the same conformance suite. The vLLM engine takes ~10 s to start, so one serves a whole
module and gets its original weights back after any test that changed them; its tests
are marked ``vllm`` (CI installs the extra; ``-m 'not vllm'`` skips them locally)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors.engines import EngineCore, open_torch_engine
from actors.models import Checkpoint, load_checkpoint


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def checkpoint(tiny_path: Path) -> Checkpoint:
    """A fresh copy per test: weight-update tests change the engine's model."""
    return load_checkpoint(tiny_path)


@pytest.fixture
def reference(tiny_path: Path) -> Checkpoint:
    """The same weights, untouched by any engine: the learner's side of comparisons."""
    return load_checkpoint(tiny_path)


@pytest.fixture
async def torch_engine(checkpoint: Checkpoint) -> AsyncIterator[EngineCore]:
    async with open_torch_engine(checkpoint, policy="solver", max_batch=16) as core:
        yield core


@pytest.fixture(scope="module")
async def vllm_core(tiny_path: Path) -> AsyncIterator[EngineCore]:
    from actors.engines.vllm_engine import open_vllm_engine

    async with open_vllm_engine(tiny_path, policy="solver", max_batch=16) as core:
        yield core


@pytest.fixture
async def vllm_engine(vllm_core: EngineCore, tiny_path: Path) -> AsyncIterator[EngineCore]:
    version = vllm_core.version
    yield vllm_core
    if vllm_core.version != version:
        original = list(load_checkpoint(tiny_path).model.state_dict().items())
        await vllm_core.update_weights(vllm_core.version + 1, original)


@pytest.fixture(params=["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_engine")
