"""Generation engines: one interface (``EngineCore``), served on the runtime by
``EngineActor``. ``torch`` is the embedded default; ``vllm`` is an optional extra."""

from actors.engines.base import BadRequest, EngineActor, EngineCore
from actors.engines.torch_engine import TorchEngine, open_torch_engine
from actors.engines.weights import from_bucket, to_buckets

__all__ = [
    "BadRequest",
    "EngineActor",
    "EngineCore",
    "TorchEngine",
    "from_bucket",
    "open_torch_engine",
    "to_buckets",
]
