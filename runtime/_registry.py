"""The name registry: an ordinary actor on the head node, named ``runtime/registry``.

Nodes register every actor they spawn under its name (``engine/solver/0``,
``learner/policy``) together with their own listening address, so a lookup tells the
caller both where the actor lives and how to dial that node. A lookup may wait for a
name to appear, which lets a cluster start in any order.
"""

from __future__ import annotations

import anyio

from ._actor import Actor
from ._message import Message, Request

REGISTRY = "runtime/registry"


class Location(Message, frozen=True):
    name: str
    node: str = ""
    address: str = ""
    found: bool = False


class Registered(Message, frozen=True):
    name: str


class Register(Request[Registered], frozen=True):
    name: str
    node: str
    address: str


class Unregister(Request[Registered], frozen=True):
    name: str
    node: str


class Lookup(Request[Location], frozen=True):
    """Where ``name`` lives; waits up to ``wait`` seconds for it to be registered."""

    name: str
    wait: float = 0.0


class Registry(Actor):
    """Concurrency bounds how many lookups may wait at once; registrations and
    lookups that can be answered at once never wait."""

    inbox = Register | Unregister | Lookup
    mailbox_size = 1024
    concurrency = 256

    def __init__(self) -> None:
        self._entries: dict[str, Location] = {}
        self._arrivals: dict[str, anyio.Event] = {}

    async def handle(self, message: Register | Unregister | Lookup) -> Registered | Location:
        match message:
            case Register(name=name, node=node, address=address):
                existing = self._entries.get(name)
                if (
                    existing is not None
                    and existing.node != node
                    and self.node.peer_is_up(existing.node)
                ):
                    raise ValueError(
                        f"the name {name!r} is taken by an actor on node {existing.node!r}"
                    )
                self._entries[name] = Location(name, node, address, found=True)
                arrival = self._arrivals.pop(name, None)
                if arrival is not None:
                    arrival.set()
                return Registered(name)
            case Unregister(name=name, node=node):
                existing = self._entries.get(name)
                if existing is not None and existing.node == node:
                    del self._entries[name]
                return Registered(name)
            case Lookup(name=name, wait=wait):
                location = self._entries.get(name)
                if location is None and wait > 0:
                    arrival = self._arrivals.setdefault(name, anyio.Event())
                    with anyio.move_on_after(wait):
                        await arrival.wait()
                    location = self._entries.get(name)
                return location or Location(name)
