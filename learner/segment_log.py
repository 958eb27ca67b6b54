"""The learner's write-ahead log of accepted segments, so a killed learner loses none.

A segment is acknowledged to its sender once the learner's handler returns, and from
then on the sender forgets it. So before that, the learner appends the segment to this
log and fsyncs it. A checkpoint takes the segments still held (partial groups, an
incomplete batch) into itself, and then the log starts over. A resumed learner restores
its newest checkpoint, re-admits the held segments it holds, and replays the log: the
steps it trained after that checkpoint are trained again from the same weights, and a
redelivered segment is recognised by its id and dropped.

Records are length-prefixed and checksummed: a record cut short by a kill in the middle
of a write ends the log (its segment was never acknowledged, so its sender delivers it
again). The tensors of a segment travel as the runtime encodes them for the wire.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

from actors.messages import FlushBatch, ScoredSegment
from runtime import Codec

Record = ScoredSegment | FlushBatch
"""What the log holds: accepted segments, and the flushes that cut a batch short (a
replay must cut its batches where the original did)."""

_HEADER = struct.Struct("<III")  # checksum of the body, payload bytes, frame count
_LENGTH = struct.Struct("<I")


class SegmentLog:
    """An append-only log file; every ``append`` is on disk when it returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._codec = Codec()
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open for the log's life

    def append(self, scored: Record) -> None:
        self._file.write(encode_record(self._codec, scored))
        self._file.flush()
        os.fsync(self._file.fileno())

    def restart(self) -> None:
        """Empty the log: a checkpoint now holds everything it held."""
        self._file.truncate(0)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def write_segments(path: str | Path, segments: Iterable[Record]) -> None:
    """Write ``segments`` as a log file of their own, flushed to disk."""
    codec = Codec()
    with open(path, "wb") as file:
        for scored in segments:
            file.write(encode_record(codec, scored))
        file.flush()
        os.fsync(file.fileno())


def read_segments(path: str | Path) -> list[Record]:
    """The records of a log file in the order they were written, up to the first
    record that is cut short or fails its checksum."""
    codec = Codec()
    data = memoryview(Path(path).read_bytes())
    segments: list[Record] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        checksum, payload, frame_count = _HEADER.unpack_from(data, offset)
        lengths_end = offset + _HEADER.size + frame_count * _LENGTH.size
        if lengths_end > len(data):
            break
        lengths = [
            _LENGTH.unpack_from(data, offset + _HEADER.size + i * _LENGTH.size)[0]
            for i in range(frame_count)
        ]
        end = lengths_end + payload + sum(lengths)
        if end > len(data) or zlib.crc32(data[offset + _HEADER.size : end]) != checksum:
            break
        position = lengths_end + payload
        frames = []
        for length in lengths:
            frames.append(data[position : position + length])
            position += length
        segments.append(codec.decode(data[lengths_end : lengths_end + payload], frames, Record))
        offset = end
    return segments


def encode_record(codec: Codec, scored: Record) -> bytes:
    payload, frames = codec.encode(scored)
    body = b"".join(
        [
            *(_LENGTH.pack(memoryview(f).nbytes) for f in frames),
            payload,
            *(bytes(f) for f in frames),
        ]
    )
    return _HEADER.pack(zlib.crc32(body), len(payload), len(frames)) + body
