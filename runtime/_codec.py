"""msgpack encoding of messages, with bulk buffers moved out into frames.

``numpy.ndarray`` and ``Blob`` values are replaced in the encoded struct by a msgpack
extension that holds only a frame index, a dtype and a shape; their bytes travel as
extra ZeroMQ frames. On arrival an array is a read-only view of its frame: no copy on
either side above pyzmq's copy threshold. Nothing is ever pickled: an array of Python
objects is refused at encode time and at decode time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from ._errors import FrameError
from ._message import Blob

Buffer = bytes | memoryview

_EXT_ARRAY = 1
_EXT_BLOB = 2


class Codec:
    """Encodes and decodes payloads for one node; not shared between threads.

    The hooks msgspec calls are bound once, so the frames of the message being encoded
    or decoded are kept on the instance for the duration of one synchronous call.
    """

    def __init__(self) -> None:
        self._out: list[Buffer] = []
        self._in: Sequence[Buffer] = ()
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}

    def encode(self, obj: object) -> tuple[bytes, list[Buffer]]:
        """Encode ``obj``; returns the bytes and the buffers it referenced, in order."""
        frames: list[Buffer] = []
        self._out = frames
        try:
            return self._encoder.encode(obj), frames
        finally:
            self._out = []

    def decode(self, data: Buffer, frames: Sequence[Buffer], type_: Any) -> Any:
        """Decode ``data`` as ``type_``; extension references index into ``frames``.

        Raises ``FrameError("bad_payload", ...)`` naming what failed validation.
        """
        decoder = self._decoders.get(type_)
        if decoder is None:
            decoder = msgspec.msgpack.Decoder(type_, dec_hook=_dec_hook, ext_hook=self._ext_hook)
            self._decoders[type_] = decoder
        self._in = frames
        try:
            return decoder.decode(data)
        except (msgspec.DecodeError, ValueError, TypeError, IndexError) as exc:
            raise FrameError("bad_payload", str(exc)) from None
        finally:
            self._in = ()

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject or obj.dtype.fields is not None:
                raise TypeError(f"arrays of dtype {obj.dtype} cannot travel as frames")
            array = np.ascontiguousarray(obj)
            self._out.append(array.data.cast("B") if array.nbytes else b"")
            header = (len(self._out) - 1, array.dtype.str, array.shape)
            return msgspec.msgpack.Ext(_EXT_ARRAY, msgspec.msgpack.encode(header))
        if isinstance(obj, Blob):
            self._out.append(obj.view)
            return msgspec.msgpack.Ext(_EXT_BLOB, msgspec.msgpack.encode(len(self._out) - 1))
        raise TypeError(f"cannot encode objects of type {type(obj).__name__}")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == _EXT_ARRAY:
            index, dtype_str, shape = msgspec.msgpack.decode(data, type=tuple[int, str, list[int]])
            dtype = np.dtype(dtype_str)
            if dtype.hasobject:
                raise ValueError(f"frame {index}: arrays of dtype {dtype} are refused")
            frame = self._frame(index)
            expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            nbytes = memoryview(frame).nbytes
            if nbytes != expected or min(shape, default=0) < 0:
                raise ValueError(
                    f"frame {index} holds {nbytes} bytes, shape {shape} of {dtype} needs {expected}"
                )
            array = np.frombuffer(frame, dtype=dtype).reshape(shape)
            array.flags.writeable = False
            return array
        if code == _EXT_BLOB:
            index = msgspec.msgpack.decode(data, type=int)
            return Blob(self._frame(index))
        raise ValueError(f"unknown extension code {code}")

    def _frame(self, index: int) -> Buffer:
        if not 0 <= index < len(self._in):
            raise ValueError(f"frame index {index} out of range ({len(self._in)} frames)")
        return self._in[index]


def _dec_hook(type_: Any, obj: Any) -> Any:
    if isinstance(obj, type_):
        return obj
    raise TypeError(f"expected {type_.__name__}, got {type(obj).__name__}")
