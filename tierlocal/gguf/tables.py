"""The gguf library's tables — quantisation types and their block sizes, value types, metadata
key names, file types — from its ``gguf.constants`` module alone.

``import gguf.constants`` runs the package's ``__init__`` first, which imports its reader,
writer, vocabulary and metadata modules with numpy and yaml: ~0.15 s of CPU at every start of
the CLI, for tables that are plain Python. This module loads ``constants.py`` from the installed
package by itself, under its own name ``gguf.constants``, so the enums are the library's own:
a later ``import gguf`` (the GGUF writer, llama-cpp-python) finds it in ``sys.modules`` and uses
the same classes. No library offers the tables apart from the package; this is the whole
workaround. Pure: it reads no file but the library's source, as any import does.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["GGML_QUANT_SIZES", "GGUF_DEFAULT_ALIGNMENT", "GGUF_MAGIC", "GGMLQuantizationType", "GGUFValueType", "Keys", "LlamaFileType"]

_NAME = "gguf.constants"


def _load_constants() -> ModuleType:
    """``gguf.constants``: the one already imported, else the library's file executed alone."""
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("gguf")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed (pip install gguf)")
    location = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location(_NAME, location)
    if spec is None or spec.loader is None:
        raise ImportError(f"gguf's constants module is not at {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return module


if TYPE_CHECKING:
    from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType, Keys, LlamaFileType
else:
    _constants = _load_constants()
    GGML_QUANT_SIZES = _constants.GGML_QUANT_SIZES
    GGUF_DEFAULT_ALIGNMENT = _constants.GGUF_DEFAULT_ALIGNMENT
    GGUF_MAGIC = _constants.GGUF_MAGIC
    GGMLQuantizationType = _constants.GGMLQuantizationType
    GGUFValueType = _constants.GGUFValueType
    Keys = _constants.Keys
    LlamaFileType = _constants.LlamaFileType
