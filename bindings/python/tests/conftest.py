"""Shared helpers: the repository's reference files (tests/data), read without extra packages."""

import json
import pathlib
import struct

import numpy as np
import pytest

DATA = pathlib.Path(__file__).resolve().parents[3] / "tests" / "data"

_DTYPES = {"F32": np.float32, "F64": np.float64, "BOOL": np.bool_, "I64": np.int64,
           "I32": np.int32, "F16": np.float16, "U8": np.uint8}


def read_safetensors(path):
    """(tensors, metadata) of a .safetensors file: 8 bytes of header length, the JSON header,
    then each tensor's bytes at its offsets."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        tensors[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(info["shape"]).copy()
    return tensors, {k: json.loads(v) for k, v in meta.items()}


@pytest.fixture(scope="session")
def data_dir():
    assert DATA.is_dir(), f"the reference files are missing: {DATA}"
    return DATA
