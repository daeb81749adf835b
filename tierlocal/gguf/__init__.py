"""GGUF headers: bounded parsing, sources (local, HTTP Range, hf://) and summaries."""

from .parse import ArraySummary, GGUFHeader, HeaderLimits, RangeReader, TensorInfo, parse_header
from .sources import parse_source, read_headers, shard_names
from .summary import ModelSummary, QuantShare, summarize

__all__ = [
    "ArraySummary",
    "GGUFHeader",
    "HeaderLimits",
    "ModelSummary",
    "QuantShare",
    "RangeReader",
    "TensorInfo",
    "parse_header",
    "parse_source",
    "read_headers",
    "shard_names",
    "summarize",
]
