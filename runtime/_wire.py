"""The link protocol: what one ZeroMQ multipart message between two nodes holds.

A multipart message is one *batch*: frame 0 is a ``Header``, the remaining frames are
the bulk buffers of its items, in item order. Many small items share one batch, which
is how the runtime pays the per-send cost of ZeroMQ and of the event loop once for
many messages. Each item is kept as ``Raw`` in the header, and each ``Data`` item's
payload is kept ``Raw`` in the item, so a malformed item fails that item alone and a
malformed payload fails that message alone.

Every batch doubles as a heartbeat and carries the sender's view of the link:

* ``incarnation``: a random id of the sending process; a new one means the peer
  restarted, so whatever it had not acknowledged is sent again.
* ``base``: every data sequence number up to ``base`` from this sender is settled; the
  receiver forgets them (its duplicate filter starts above ``base``).
* ``received`` (valid when ``peer_incarnation`` names the addressee's incarnation): the
  highest sequence number up to which the sender has received everything from the
  addressee; anything above it that stays unacknowledged is retransmitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ._errors import FrameError

PROTOCOL = 2

Buffer = bytes | memoryview


class Header(msgspec.Struct, array_like=True, frozen=True):
    protocol: int
    sender: str
    incarnation: int
    peer_incarnation: int
    base: int
    received: int
    settled: int
    items: list[tuple[int, msgspec.Raw]]


class Data(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A message for actor ``target``; ``call`` is 0 for one-way sends."""

    seq: int
    target: str
    source: str
    call: int
    trace: int
    payload: msgspec.Raw


class DataOut(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """``Data`` as encoded: the payload is the message object itself."""

    seq: int
    target: str
    source: str
    call: int
    trace: int
    payload: Any


OK, ERROR, REJECTED, NOT_FOUND = 0, 1, 2, 3


class Reply(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """The answer to call ``call``: a result when ``status`` is OK, else an ErrorInfo."""

    call: int
    status: int
    payload: msgspec.Raw


class ReplyOut(msgspec.Struct, array_like=True, frozen=True, tag=2):
    call: int
    status: int
    payload: Any


class Ack(msgspec.Struct, array_like=True, frozen=True, tag=3):
    """These data messages were handled (or rejected for good): forget them."""

    seqs: list[int]


class Nack(msgspec.Struct, array_like=True, frozen=True, tag=4):
    """This data message was not accepted now (no such actor yet, or a sender far over
    its credit); keep it and send it again later."""

    seq: int
    reason: str


class CreditRequest(msgspec.Struct, array_like=True, frozen=True, tag=5):
    """The sender holds no credit for ``target`` and has messages for it; ``outstanding``
    of its messages to ``target`` are not yet acknowledged (some may still be in transit,
    and the receiver keeps slots for those)."""

    target: str
    outstanding: int


class CreditGrant(msgspec.Struct, array_like=True, frozen=True, tag=6):
    target: str
    amount: int


class CreditReturn(msgspec.Struct, array_like=True, frozen=True, tag=7):
    """Credit the sender did not use; the slots go back to the receiver's pool."""

    target: str
    amount: int


class CreditDenied(msgspec.Struct, array_like=True, frozen=True, tag=8):
    """No actor named ``target`` lives on this node."""

    target: str


Item = Data | Reply | Ack | Nack | CreditRequest | CreditGrant | CreditReturn | CreditDenied


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True):
    """What a failed call sends back in place of a result."""

    actor: str
    type_name: str
    message: str
    traceback: str = ""


_header_decoder = msgspec.msgpack.Decoder(Header)
_item_decoder = msgspec.msgpack.Decoder(Item)
_error_decoder = msgspec.msgpack.Decoder(ErrorInfo)
_encoder = msgspec.msgpack.Encoder()


def encode_item(item: msgspec.Struct) -> bytes:
    """Encode a control item (one that carries no frames)."""
    return _encoder.encode(item)


def encode_batch(
    sender: str,
    incarnation: int,
    peer_incarnation: int,
    base: int,
    received: int,
    settled: int,
    items: Sequence[tuple[bytes, Sequence[Buffer]]],
) -> list[Buffer]:
    """Assemble the frames of one batch from encoded items and their buffers."""
    header = Header(
        PROTOCOL,
        sender,
        incarnation,
        peer_incarnation,
        base,
        received,
        settled,
        [(len(frames), msgspec.Raw(data)) for data, frames in items],
    )
    out: list[Buffer] = [_encoder.encode(header)]
    for _, frames in items:
        out.extend(frames)
    return out


def decode_header(frames: Sequence[Buffer], max_frame_bytes: int) -> Header:
    """Validate a batch's framing; raises FrameError naming what is wrong."""
    if not frames:
        raise FrameError("empty", "a message with no frames")
    for index, frame in enumerate(frames):
        size = memoryview(frame).nbytes
        if size > max_frame_bytes:
            raise FrameError(
                "oversized", f"frame {index} is {size} bytes, the limit is {max_frame_bytes}"
            )
    try:
        header = _header_decoder.decode(frames[0])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError("bad_header", f"frame 0: {exc}") from None
    if header.protocol != PROTOCOL:
        raise FrameError(
            "protocol", f"peer speaks protocol {header.protocol}, this node speaks {PROTOCOL}"
        )
    counts = [count for count, _ in header.items]
    if min(counts, default=0) < 0 or sum(counts) != len(frames) - 1:
        raise FrameError(
            "frame_count",
            f"header announces {sum(counts)} buffer frames, the message has {len(frames) - 1}",
        )
    return header


def decode_item(data: msgspec.Raw) -> Item:
    try:
        return _item_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError("bad_item", str(exc)) from None


def decode_error(data: msgspec.Raw) -> ErrorInfo:
    try:
        return _error_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError("bad_item", f"error reply: {exc}") from None
