"""relaytrain's actor runtime: actors exchanging msgspec messages over ZeroMQ.

General layout (everything public is re-exported here; the modules are private):

* ``_message``: the ``Message`` / ``Request[R]`` base classes, ``ActorRef``, ``Blob``
* ``_codec``: msgpack encoding with numpy arrays and blobs moved out into frames
* ``_wire``: the link protocol's batch and item structs
* ``_link``: per-peer delivery: sequence numbers, acks, credit, dedupe, heartbeats
* ``_cell``: an actor's mailbox, credit pool and workers; ``_actor``: the user base class
* ``_supervisor``: OTP-style restart strategies
* ``_node``: ``open_node`` and routing; ``_registry``: the head node's name registry
* ``_transport``: the transport interface; ``_zmq`` and ``_memory`` implement it
* ``_lifetime``: ``wait_until_stopped``, what a node process serves until

The runtime knows nothing about LLMs and never imports torch.
"""

from ._actor import Actor, Delivery, current_delivery
from ._cell import ActorStatistics
from ._codec import Codec
from ._config import NodeConfig
from ._errors import (
    ActorNotFound,
    CallTimeout,
    FrameError,
    MessageRejected,
    PeerUnavailable,
    RelayError,
    RemoteError,
    SupervisionEscalated,
)
from ._lifetime import wait_until_stopped
from ._link import LinkStatistics
from ._log import configure_logging
from ._memory import MemoryNetwork
from ._message import ActorRef, Blob, Message, Request
from ._node import Node, NodeStatistics, open_node
from ._supervisor import Supervisor
from ._transport import Connection, Endpoint, Transport
from ._zmq import CurveKeys, KeysError, ZmqTransport, create_cluster_keys, load_cluster_keys

__all__ = [
    "Actor",
    "ActorNotFound",
    "ActorRef",
    "ActorStatistics",
    "Blob",
    "CallTimeout",
    "Codec",
    "Connection",
    "CurveKeys",
    "Delivery",
    "Endpoint",
    "FrameError",
    "KeysError",
    "LinkStatistics",
    "MemoryNetwork",
    "Message",
    "MessageRejected",
    "Node",
    "NodeConfig",
    "NodeStatistics",
    "PeerUnavailable",
    "RelayError",
    "RemoteError",
    "Request",
    "SupervisionEscalated",
    "Supervisor",
    "Transport",
    "ZmqTransport",
    "configure_logging",
    "create_cluster_keys",
    "current_delivery",
    "load_cluster_keys",
    "open_node",
    "wait_until_stopped",
]
