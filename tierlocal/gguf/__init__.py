"""GGUF headers: bounded parsing and summaries (pure, over bytes a reader hands in).

Where the bytes come from (a local path, HTTP Range requests, ``hf://``) is I/O and lives in
:mod:`tierlocal.fetch.sources`, which this package face does not import.
"""

from .chat_template import ChatTemplateInfo, chat_template_info
from .parse import ArraySummary, GGUFHeader, HeaderLimits, RangeReader, TensorInfo, parse_header
from .summary import ModelSummary, QuantShare, summarize

__all__ = [
    "ArraySummary",
    "ChatTemplateInfo",
    "GGUFHeader",
    "HeaderLimits",
    "ModelSummary",
    "QuantShare",
    "RangeReader",
    "TensorInfo",
    "chat_template_info",
    "parse_header",
    "summarize",
]
