"""Links authenticated with a cluster's CURVE keys: nodes holding the keys talk, and a
node or a raw socket without them never gets a frame to an actor."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import structlog
import zmq

from runtime import (
    CurveKeys,
    KeysError,
    NodeConfig,
    create_cluster_keys,
    load_cluster_keys,
    open_node,
)
from runtime._wire import PROTOCOL, DataOut, Header
from tests.sample_actors import Add, Counter, Get

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def keys_in(directory: Path) -> CurveKeys:
    create_cluster_keys(directory)
    return load_cluster_keys(directory)


def add_to_counter(sender: str, n: int) -> list[bytes]:
    """A well-formed batch that adds ``n`` to the actor named ``counter``."""
    item = msgspec.msgpack.encode(DataOut(1, "counter", "intruder", 0, 0, Add(n)))
    return [
        msgspec.msgpack.encode(Header(PROTOCOL, sender, 7, 0, 0, 0, 0, [(0, msgspec.Raw(item))]))
    ]


async def test_nodes_holding_the_cluster_keys_talk(tmp_path: Path) -> None:
    keys = keys_in(tmp_path)
    async with (
        open_node("head", keys=keys) as head,
        open_node("worker", head=head.address, keys=keys) as worker,
    ):
        await head.spawn("counter", Counter)
        counter = await worker.lookup("counter", timeout=5)
        await worker.send(counter, Add(2))
        assert (await worker.call(counter, Get(), timeout=5)).value == 2


@pytest.mark.parametrize("intruder", ["no keys", "another cluster's keys"])
async def test_a_peer_without_the_cluster_keys_reaches_no_actor(
    tmp_path: Path, intruder: str
) -> None:
    keys = keys_in(tmp_path / "cluster")
    other = keys_in(tmp_path / "other") if intruder != "no keys" else None
    async with open_node("head", keys=keys) as head:
        await head.spawn("counter", Counter)
        context = zmq.Context()
        raw = context.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.ROUTING_ID, b"intruder")
        if other is not None:
            raw.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
            raw.setsockopt(zmq.CURVE_PUBLICKEY, other.public)
            raw.setsockopt(zmq.CURVE_SECRETKEY, other.secret)
        raw.connect(head.address)
        try:
            with structlog.testing.capture_logs() as logs:
                raw.send_multipart(add_to_counter("intruder", 5), zmq.NOBLOCK)
                # A whole node tries to join for a second; what the raw socket sent has
                # had that long to arrive, had it been let in.
                joined = True
                try:
                    async with open_node(
                        "intruder", head=head.address, keys=other, config=NodeConfig(call_timeout=1)
                    ):
                        pass
                except* TimeoutError:
                    joined = False
                assert not joined
        finally:
            context.destroy(linger=0)
        counter = await head.lookup("counter", timeout=5)
        assert (await head.call(counter, Get(), timeout=5)).value == 0
        statistics = head.statistics()
        assert not statistics.rejected, "a frame got past the handshake"
        assert all(link.peer != "intruder" for link in statistics.links)
        if other is not None:
            denied = [log for log in logs if log.get("reason") == "curve_key"]
            assert denied and other.public.decode() in denied[0]["detail"]


def test_keys_are_created_once_and_the_secret_is_private(tmp_path: Path) -> None:
    secret = create_cluster_keys(tmp_path / "keys")
    assert secret.stat().st_mode & 0o077 == 0
    keys = load_cluster_keys(tmp_path / "keys")
    assert len(keys.public) == len(keys.secret) == 40
    with pytest.raises(KeysError, match="already holds cluster keys"):
        create_cluster_keys(tmp_path / "keys")


def test_a_directory_without_keys_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match=f"{tmp_path}: no cluster.key_secret"):
        load_cluster_keys(tmp_path)
    (tmp_path / "cluster.key_secret").write_text("not a key\n")
    with pytest.raises(KeysError, match=r"cluster\.key_secret: not a CURVE key pair"):
        load_cluster_keys(tmp_path)
