"""Mixed into vLLM's worker (``worker_extension_cls``) in the engine-core process.

vLLM's RL weight-transfer API is GPU-only, and tensors passed as plain RPC arguments
to the engine-core process arrive as lists. So a version's tensors reach it as a
safetensors file in shared memory (the engine core is always a child process on the same
host; bytes through its RPC socket cost seconds for a 120M model, all of it inside the
generation pause) and are loaded with vLLM's in-place reload, which restores the layout
the CPU backend re-packs linear weights into, loads, and re-packs.
This module must not import vLLM or the runtime: the worker imports it by name.
"""

from __future__ import annotations

from typing import Any


class WeightReceiver:
    """Worker methods are looked up by name: ours carry a prefix no worker method has."""

    reload_weights: Any

    def relaytrain_load_weights(self, path: str) -> int:
        """Load the named tensors of the safetensors file at ``path`` in place; returns
        how many."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        self.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)
