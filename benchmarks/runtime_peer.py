"""The far end of the runtime benchmark, run as its own process.

``runtime`` mode joins the driver's head node and hosts a ``Sink`` (counts what it is
sent; a ``Flush`` call answers once everything sent before it was handled) and an
``Echo`` actor for call latency. ``raw`` mode is the baseline: blocking pyzmq PULL and
REP sockets doing the same jobs with no runtime in between.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import zmq

from benchmarks.runtime_messages import Flush, Flushed, Payload, Ping, Pong
from runtime import Actor, open_node


class Sink(Actor):
    inbox = Payload | Flush
    mailbox_size = 4096

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    async def handle(self, message: Payload | Flush) -> Flushed | None:
        if isinstance(message, Flush):
            flushed = Flushed(self.count, self.bytes)
            self.count = self.bytes = 0
            return flushed
        self.count += 1
        self.bytes += message.size
        return None


class Echo(Actor):
    inbox = Ping

    async def handle(self, message: Ping) -> Pong:
        return Pong(message.data)


async def serve_runtime(head: str, listen: str) -> None:
    async with open_node("peer", listen=listen, head=head) as node:
        await node.spawn("sink", Sink)
        await node.spawn("echo", Echo)
        print(json.dumps({"ready": node.address}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the driver closes our stdin


def serve_raw(transport: str, directory: str) -> None:
    context = zmq.Context()
    pull, push, rep = (context.socket(kind) for kind in (zmq.PULL, zmq.PUSH, zmq.REP))
    addresses = {}
    for name, sock in (("pull", pull), ("push", push), ("rep", rep)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.bind("tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{directory}/raw-{name}")
        addresses[name] = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    print(json.dumps(addresses), flush=True)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    poller.register(rep, zmq.POLLIN)
    count = 0
    while True:
        for sock, _ in poller.poll():
            if sock is rep:
                rep.send(rep.recv(copy=False), copy=False)
                continue
            frame = pull.recv(copy=False)
            if len(frame) == 3 and frame.bytes == b"END":  # payloads are never this short
                push.send(str(count).encode())
                count = 0
            elif len(frame) == 4 and frame.bytes == b"STOP":
                return
            else:
                count += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["runtime", "raw"])
    parser.add_argument("--head", default="")
    parser.add_argument("--listen", default="")
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    if args.mode == "runtime":
        anyio.run(serve_runtime, args.head, args.listen, backend="trio")
    else:
        serve_raw(args.transport, args.dir)


if __name__ == "__main__":
    main()
