"""Messages of the runtime benchmark, shared by the driver and its peer process."""

from __future__ import annotations

from runtime import Blob, Message, Request


class Payload(Message, frozen=True):
    """``inline`` for small payloads (encoded in the struct), ``blob`` for bulk ones
    (a frame of its own, zero-copy above 64 KiB)."""

    size: int
    inline: bytes = b""
    blob: Blob | None = None


class Flushed(Message, frozen=True):
    count: int
    bytes: int


class Flush(Request[Flushed], frozen=True):
    pass


class Pong(Message, frozen=True):
    data: bytes


class Ping(Request[Pong], frozen=True):
    data: bytes
