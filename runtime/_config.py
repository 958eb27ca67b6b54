"""A node's tunables, in one visible place, each with the reason for its default."""

from __future__ import annotations

import msgspec


class NodeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Timeouts are in seconds, sizes in bytes.

    A link is declared down after ``heartbeat_timeout`` seconds without a batch from
    the peer; every link sends at least one batch per ``heartbeat_interval``.
    Unacknowledged data the peer has not reported as received is sent again after
    ``resend_interval``. Credit a sender has not used for ``credit_idle`` seconds goes
    back to the receiver, so idle senders do not hold mailbox slots others wait for.
    """

    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 5.0
    resend_interval: float = 1.0
    credit_idle: float = 2.0
    call_timeout: float = 30.0
    shutdown_timeout: float = 5.0
    max_frame_bytes: int = 1 << 30
    """Frames larger than this are rejected and counted; weight buckets fit below it."""
    batch_items: int = 256
    """At most this many items share one ZeroMQ send; more start another."""
    batch_bytes: int = 1 << 20
    """A batch stops growing once its frames hold this much."""
    max_peers: int = 4096
    """Batches from further unknown senders are rejected rather than tracked."""
    max_attempts: int = 3
    """A one-way message whose handler crashed the actor this often is dead-lettered."""

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval",
            "heartbeat_timeout",
            "resend_interval",
            "credit_idle",
            "call_timeout",
            "shutdown_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"NodeConfig.{name} must be positive, got {getattr(self, name)}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                "NodeConfig.heartbeat_timeout must exceed heartbeat_interval "
                f"({self.heartbeat_timeout} <= {self.heartbeat_interval})"
            )
        for name in ("max_frame_bytes", "batch_items", "batch_bytes", "max_peers", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"NodeConfig.{name} must be at least 1, got {getattr(self, name)}")
