"""The ZeroMQ transport: the only module that touches zmq.

pyzmq has no trio integration, so every socket gets one watcher task that waits on
the socket's file descriptor and reads whatever is ready. The descriptor is
edge-triggered and signals only "something changed" (also when the socket became
writable), and any zmq call, a send included, can consume the edge. Hence:

* the watcher re-reads ``zmq.EVENTS`` after every wake-up and drains the socket before
  it waits again;
* a send from any other task re-reads ``EVENTS`` afterwards and, if input is pending,
  cancels the watcher's wait so that it looks again (only one task may wait on a
  descriptor: a second ``wait_readable`` raises ``BusyResourceError``);
* a sender that finds the socket full parks on an event the watcher sets when it sees
  ``POLLOUT``.

Each node has one ROUTER (inbound; replies travel back through it by routing id) and
one DEALER per peer it dials. Options are explicit: ``LINGER`` 0 (delivery is
guaranteed by acknowledgements, never by lingering), ``IMMEDIATE`` on dealers (queue
only on completed connections), ``ROUTER_MANDATORY`` (an unroutable send is an error,
not a silent drop) and ``ROUTER_HANDOVER`` (a restarted peer takes over its identity).

Links between hosts are authenticated and encrypted with CURVE when the transport is
given a cluster's ``CurveKeys``: every node holds the same key pair, serves with its
secret key, dials with the pair, and a ZAP authenticator (pyzmq's, on a thread of its
own) admits only peers that present the cluster's public key, which CURVE's handshake
makes them prove they hold the secret for. A peer without the keys never completes a
handshake, so none of its frames reaches the node. One pair per cluster rather than one
per node keeps key distribution to a single directory on a shared or copied path.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from ._log import get_logger
from ._transport import Buffer, Connection, Endpoint, OnFrames, Transport

_DRAIN = 64
_BIND_RETRY_S = 5.0
_KEY_NAME = "cluster"

log = get_logger()


class CurveKeys(msgspec.Struct, frozen=True):
    """A cluster's CURVE key pair, Z85-encoded."""

    public: bytes
    secret: bytes


class KeysError(ValueError):
    """A keys directory is missing, incomplete or unreadable; the message names it."""


def create_cluster_keys(directory: str | Path) -> Path:
    """Write a new key pair into ``directory`` (created if needed; an existing pair is
    never overwritten) and return the secret file, readable by its owner only."""
    directory = Path(directory)
    secret = directory / f"{_KEY_NAME}.key_secret"
    if secret.exists():
        raise KeysError(f"{directory} already holds cluster keys; use another directory")
    directory.mkdir(parents=True, exist_ok=True)
    _, secret_file = zmq.auth.create_certificates(directory, _KEY_NAME)
    os.chmod(secret_file, 0o600)
    return Path(secret_file)


def load_cluster_keys(directory: str | Path) -> CurveKeys:
    """The key pair ``create_cluster_keys`` wrote into ``directory``."""
    secret = Path(directory) / f"{_KEY_NAME}.key_secret"
    if not secret.is_file():
        raise KeysError(f"{directory}: no {secret.name} (create one with `bin/launch keys DIR`)")
    try:
        public, secret_key = zmq.auth.load_certificate(secret)
    except (OSError, ValueError) as error:
        raise KeysError(f"{secret}: not a CURVE key pair ({error})") from None
    if not secret_key:
        raise KeysError(f"{secret}: holds no secret key")
    return CurveKeys(public, secret_key)


class _OnlyTheClusterKey:
    """The ZAP credentials check: a peer's public key must be the cluster's."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.public:
            return True
        log.warning("rejected", reason="curve_key", detail=f"unknown public key {key!r}")
        return False


class ZmqTransport(Transport):
    """tcp:// and ipc:// over ZeroMQ.

    ``hwm`` bounds the batches libzmq queues per peer (a safety net under credit flow
    control, never the mechanism); ``max_message_bytes`` makes libzmq drop a peer that
    sends a larger frame, before it is ever allocated in full. With ``curve`` every
    socket authenticates and encrypts with the cluster's keys (see the module
    docstring).
    """

    def __init__(
        self, *, hwm: int = 10_000, max_message_bytes: int = -1, curve: CurveKeys | None = None
    ) -> None:
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        self.curve = curve

    @asynccontextmanager
    async def open(self, identity: str, on_frames: OnFrames) -> AsyncIterator[Endpoint]:
        context = zmq.Context()
        authenticator = None
        if self.curve is not None:
            authenticator = ThreadAuthenticator(context)
            authenticator.start()
            authenticator.configure_curve_callback("*", _OnlyTheClusterKey(self.curve.public))
        try:
            async with anyio.create_task_group() as tasks:
                endpoint = _ZmqEndpoint(self, context, identity.encode(), on_frames, tasks)
                try:
                    yield endpoint
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            if authenticator is not None:
                authenticator.stop()
            context.destroy(linger=0)


class _ZmqEndpoint(Endpoint):
    def __init__(
        self,
        transport: ZmqTransport,
        context: zmq.Context[zmq.Socket[bytes]],
        identity: bytes,
        on_frames: OnFrames,
        tasks: anyio.abc.TaskGroup,
    ) -> None:
        self._transport = transport
        self._context = context
        self._identity = identity
        self._on_frames = on_frames
        self._tasks = tasks
        self._routes: dict[bytes, _RouterRoute] = {}

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._transport.hwm)
        sock.setsockopt(zmq.RCVHWM, self._transport.hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self._transport.max_message_bytes)
        curve = self._transport.curve
        if curve is not None:
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
            if kind == zmq.ROUTER:
                sock.setsockopt(zmq.CURVE_SERVER, 1)
            else:
                sock.setsockopt(zmq.CURVE_SERVERKEY, curve.public)
        return sock

    async def listen(self, address: str) -> str:
        sock = self._socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        with anyio.fail_after(_BIND_RETRY_S):
            while True:
                try:
                    sock.bind(address)
                    break
                except zmq.ZMQError as exc:
                    # libzmq closes asynchronously: a just-released port can be busy.
                    if exc.errno != errno.EADDRINUSE:
                        sock.close()
                        raise OSError(exc.errno, f"cannot listen at {address}: {exc}") from exc
                await anyio.sleep(0.05)
        driver = _SocketDriver(sock, self._on_router_message)
        self._tasks.start_soon(driver.run)
        self._router = driver
        bound: bytes = sock.getsockopt(zmq.LAST_ENDPOINT)  # type: ignore[assignment]
        return bound.decode()

    def dial(self, address: str) -> Connection:
        sock = self._socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self._identity)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(address)
        connection = _DealerConnection(address)
        driver = _SocketDriver(sock, lambda parts: self._on_frames(connection, parts))
        connection.driver = driver
        self._tasks.start_soon(driver.run)
        return connection

    def _on_router_message(self, parts: list[Buffer]) -> None:
        identity = bytes(parts[0])
        route = self._routes.get(identity)
        if route is None:
            route = self._routes[identity] = _RouterRoute(self._router, identity)
        self._on_frames(route, parts[1:])


class _SocketDriver:
    """Owns one socket: a watcher task reads it; any task may send on it."""

    def __init__(self, sock: zmq.Socket[bytes], on_message: Callable[[list[Buffer]], None]) -> None:
        self._sock = sock
        self._on_message = on_message
        self._waiting: anyio.CancelScope | None = None
        self._writable: anyio.Event | None = None

    async def run(self) -> None:
        sock = self._sock
        fd = cast(int, sock.getsockopt(zmq.FD))
        try:
            while True:
                events = _events(sock)
                if events & zmq.POLLOUT and self._writable is not None:
                    self._writable.set()
                    self._writable = None
                if events & zmq.POLLIN:
                    if self._drain():
                        await anyio.lowlevel.checkpoint()
                    continue
                with anyio.CancelScope() as self._waiting:
                    await anyio.wait_readable(fd)
                self._waiting = None
        finally:
            sock.close(linger=0)

    def _drain(self) -> bool:
        """Read up to a batch of ready messages; True if more may be waiting."""
        for _ in range(_DRAIN):
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            self._on_message([part.buffer for part in parts])
        return True

    def send_nowait(self, parts: list[Buffer]) -> None:
        try:
            self._sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise anyio.WouldBlock from None
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise anyio.BrokenResourceError("peer is not connected") from exc
            raise
        finally:
            self._kick_if_readable()

    async def wait_writable(self) -> None:
        if _events(self._sock) & zmq.POLLOUT:
            await anyio.lowlevel.checkpoint()
            return
        if self._writable is None:
            self._writable = anyio.Event()
        writable = self._writable
        if self._waiting is not None:
            self._waiting.cancel()  # our EVENTS read may have eaten the watcher's edge
        await writable.wait()

    def _kick_if_readable(self) -> None:
        if self._waiting is not None and _events(self._sock) & zmq.POLLIN:
            self._waiting.cancel()


class _DealerConnection(Connection):
    driver: _SocketDriver

    def __init__(self, address: str) -> None:
        self.address = address

    def send_nowait(self, frames: list[Buffer]) -> None:
        self.driver.send_nowait(frames)

    async def wait_writable(self) -> None:
        await self.driver.wait_writable()

    def __repr__(self) -> str:
        return f"<zmq dealer to {self.address}>"


class _RouterRoute(Connection):
    def __init__(self, router: _SocketDriver, identity: bytes) -> None:
        self._router = router
        self._identity = identity
        self.identity = identity.decode(errors="replace")

    def send_nowait(self, frames: list[Buffer]) -> None:
        self._router.send_nowait([self._identity, *frames])

    async def wait_writable(self) -> None:
        await self._router.wait_writable()

    def __repr__(self) -> str:
        return f"<zmq route back to {self._identity.decode(errors='replace')}>"


def _events(sock: zmq.Socket[bytes]) -> int:
    """Read ``zmq.EVENTS``, which also processes the socket's pending commands."""
    return cast(int, sock.getsockopt(zmq.EVENTS))
