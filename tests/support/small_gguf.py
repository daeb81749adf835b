"""Tiny GGUF files written with the gguf package's own writer, for parser and CLI tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def write_small_gguf(path: Path, arch: str, metadata: Mapping[str, object], tensors: Mapping[str, np.ndarray], *, tokens: int = 0) -> Path:
    """Write a GGUF of ``arch`` with ``metadata`` (``{arch}`` in keys is filled in; ints as
    uint32, floats as float32, lists as arrays), ``tokens`` vocabulary entries and real tensor data."""
    writer = GGUFWriter(path, arch)
    for key, value in metadata.items():
        name = key.format(arch=arch)
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, int(value))  # type: ignore[call-overload]
    if tokens:
        writer.add_token_list([f"t{i}" for i in range(tokens)])
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
