"""The base classes users build their messages from, and actor addresses.

A message is a frozen, tagged msgspec Struct. An actor declares the closed union of the
message types it accepts (its ``inbox``); anything else is rejected on arrival. A
request (a message answered by ``call``) names its reply type as a type parameter, so
the caller decodes the reply into that type and the type checker knows it::

    class Count(Message):
        value: int

    class GetCount(Request[Count]):
        key: str

    count = await node.call(ref, GetCount("a"), timeout=1.0)  # count: Count

Messages may carry ``numpy.ndarray`` fields and ``Blob`` fields; their buffers travel
as separate frames, never inside the encoded struct.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Generic, TypeVar

import msgspec

R = TypeVar("R")


class Message(msgspec.Struct, frozen=True, tag=True):
    """Base of all user messages: frozen, tagged with the class name."""


class Request(Message, Generic[R], frozen=True):
    """A message answered by a reply of type ``R``; send it with ``call``."""


class ActorRef(msgspec.Struct, frozen=True):
    """Where an actor lives: the node's name and the actor's name on it."""

    node: str
    name: str

    def __str__(self) -> str:
        return f"{self.name}@{self.node}"


class Blob:
    """Bytes that travel as a frame of their own (zero-copy above ~64 KiB).

    ``bytes`` fields are encoded inline; wrap a large buffer in ``Blob`` to keep it out
    of the encoded struct. The buffer must not change until it has been acknowledged.
    """

    __slots__ = ("_view",)

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")

    @property
    def view(self) -> memoryview:
        """The buffer, without a copy."""
        return self._view

    def __bytes__(self) -> bytes:
        return self._view.tobytes()

    def __len__(self) -> int:
        return self._view.nbytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and self._view == other._view

    def __hash__(self) -> int:
        return hash(self._view.tobytes())

    def __repr__(self) -> str:
        return f"Blob({self._view.nbytes} bytes)"


_reply_types: dict[type, Any] = {}


def reply_type_of(request_type: type) -> Any:
    """The ``R`` of a ``Request[R]`` subclass, found on its generic base."""
    try:
        return _reply_types[request_type]
    except KeyError:
        pass
    for klass in request_type.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (reply,) = typing.get_args(base)
                _reply_types[request_type] = reply
                return reply
    raise TypeError(f"{request_type.__name__} is not a Request[...] subclass; use send()")


def union_members(inbox: Any) -> tuple[type, ...]:
    """The classes of an inbox declaration: one class or a union of classes."""
    if typing.get_origin(inbox) in (typing.Union, types.UnionType):
        members = typing.get_args(inbox)
    else:
        members = (inbox,)
    for member in members:
        if not (isinstance(member, type) and issubclass(member, msgspec.Struct)):
            raise TypeError(f"inbox member {member!r} is not a msgspec Struct class")
    return members
