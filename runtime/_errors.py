"""Every error the runtime raises, classified by whose fault it was.

* ``ActorNotFound``, ``MessageRejected``: the caller asked for something that does not
  exist or sent something the receiver does not accept.
* ``RemoteError``: the receiving actor's handler raised; the original type, message and
  traceback travel back as text (never pickled) and are raised in the caller.
* ``CallTimeout``, ``PeerUnavailable``: the world broke: an answer did not come in time,
  or the node that hosts the actor stopped answering heartbeats.
* ``SupervisionEscalated``: a supervisor restarted its children more often than its
  intensity allows and gave up.
* ``FrameError``: a frame that came off the wire could not be read; the node counts it
  under ``reason`` and keeps serving.
"""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class RelayError(Exception):
    """Base class of every error the runtime raises."""


class ActorNotFound(RelayError):
    """No actor is registered under this name (or it is not on the node it was sent to)."""


class MessageRejected(RelayError):
    """The receiver could not decode or does not accept the message; it was not handled."""


class RemoteError(RelayError):
    """The handler of a call raised. ``type_name`` is the remote exception's class."""

    def __init__(self, actor: str, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{actor} raised {type_name}: {message}")
        self.actor = actor
        self.type_name = type_name
        self.message = message
        self.traceback = traceback


class CallTimeout(RelayError, TimeoutError):
    """A call got no reply within its timeout."""


class PeerUnavailable(RelayError):
    """The node hosting the target stopped answering heartbeats, or never answered."""


class SupervisionEscalated(RelayError):
    """A supervisor exceeded its restart intensity and stopped its children."""


class FrameError(RelayError):
    """A frame off the wire was malformed; ``reason`` names the statistics counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def first_leaf(error: BaseException, kind: type[E] = BaseException) -> E | None:  # type: ignore[assignment]
    """The first exception of type ``kind`` inside (possibly nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = first_leaf(inner, kind)
            if found is not None:
                return found
        return None
    return error if isinstance(error, kind) else None
