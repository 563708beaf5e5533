"""A numpy-only reader for the safetensors format, so loading weights needs no torch.

The format is deliberately trivial: 8 bytes of little-endian header length, a JSON header mapping
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
end of the header), then the raw little-endian tensor bytes. Arrays returned here are read-only
views into the given buffer (bytes, or a read-only memory map of the file); nothing is copied.
"""

from __future__ import annotations

import json
import math
import mmap
import struct

import numpy as np

__all__ = ["parse_safetensors"]

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U8": "u1", "BOOL": "?",
}  # fmt: skip


def parse_safetensors(buffer: bytes | mmap.mmap) -> dict[str, np.ndarray]:
    """Every tensor in a safetensors file's bytes, by name; ValueError if the file is malformed."""
    if len(buffer) < 8:
        raise ValueError("safetensors: file shorter than its 8-byte header length")
    (header_length,) = struct.unpack("<Q", buffer[:8])
    data_start = 8 + header_length
    if data_start > len(buffer):
        raise ValueError("safetensors: header length points past the end of the file")
    try:
        header = json.loads(buffer[8:data_start])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"safetensors: header is not valid JSON ({error})") from None
    header.pop("__metadata__", None)
    view = memoryview(buffer)[data_start:]
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"safetensors: {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= len(view) or end - begin != math.prod(shape) * np.dtype(dtype).itemsize:
            raise ValueError(f"safetensors: {name} has offsets {begin}..{end} that do not fit its shape")
        tensors[name] = np.frombuffer(view[begin:end], dtype=dtype).reshape(shape)
    return tensors
