"""A model as the planner keeps it between runs: its :class:`ModelSpec` without per-tensor
records, with the per-spec work that every plan repeats already done, as plain data. Pure.

Planning a catalog entry on a machine needs, besides the spec's own facts, tables computed from
its hundreds of tensors: the placement groups (:func:`~.placement.placement_groups`), the
speed features' matrix groups (:func:`~.features.matrix_groups`), the largest copies an
offloaded operation makes (:func:`~.offload.largest_copies`), the token embedding's bytes and
repack classes, the attention and KV-layout tables at the default settings. None of them
depends on the machine when the device binds every tensor (no ``max_tensor_bytes``), so a
catalog computes them once per entry (:func:`spec_digest`) and restores them on every run
(:func:`spec_from_digest`): the restored spec plans exactly as the one from the header did.
Its ``tensors`` are :data:`TENSORS_NOT_KEPT`, which refuse to be read: a plan on a
device with a binding limit needs the header.

The plain form holds only tuples, dicts, strings, numbers, booleans and None (``marshal`` can
store it); :data:`DIGEST_VERSION` changes with its layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, fields
from typing import Any, TypeVar

from ..gguf.chat_template import ChatTemplateInfo
from ..gguf.summary import ModelSummary, QuantShare
from .features import DEFAULT_DEPTH, PREFILL_PROMPT, MatrixGroup, matrix_groups, run_features
from .host_memory import token_embedding_repack
from .memory import kv_cache, server_context
from .model import ModelSpec, PlacedTensor
from .offload import largest_copies
from .placement import PlacementGroup, RepackClass, placement_groups

__all__ = ["DIGEST_VERSION", "TENSORS_NOT_KEPT", "spec_digest", "spec_from_digest"]

DIGEST_VERSION = 1


class _TensorsNotKept(tuple):
    """The ``tensors`` of a spec restored from its planning digest (:mod:`.digest`): the
    per-tensor work is already done, and reading a tensor is a bug, not an empty model."""

    def _refuse(self, *_args: object) -> Any:
        raise RuntimeError("this ModelSpec was restored from its planning digest and keeps no tensors: plan it from its header")

    __iter__ = __len__ = __getitem__ = __contains__ = _refuse


#: The ``tensors`` of every spec restored from a digest.
TENSORS_NOT_KEPT: tuple[PlacedTensor, ...] = _TensorsNotKept()
_SPEC_FIELDS = tuple(f.name for f in fields(ModelSpec) if f.name != "tensors")


def spec_digest(spec: ModelSpec, summary: ModelSummary) -> dict[str, Any]:
    """``spec`` (planned from its header) and ``summary`` as plain data, with the tables every
    plan of it on a device without a binding limit reads."""
    groups, ffn_width = matrix_groups(spec, None)
    run_features(spec, depth=DEFAULT_DEPTH, prompt=PREFILL_PROMPT)  # the attention table at the quoted depth
    kv_cache(spec, server_context(spec, ctx=spec.n_ctx_train, parallel=1))  # the f16 KV layout, with flash attention
    cache = spec.plan_cache
    return {
        "version": DIGEST_VERSION,
        "spec": {name: getattr(spec, name) for name in _SPEC_FIELDS},
        "summary": _summary_plain(summary),
        "placement_groups": tuple((*group[:6], tuple(tuple(cls) for cls in group.repack)) for group in placement_groups(spec, None)),
        "matrix_groups": (tuple(tuple(group) for group in groups), ffn_width),
        "largest_copies": largest_copies(spec, None),
        "token_embd_bytes": spec.token_embd_bytes,
        "token_embd_repack": tuple(tuple(cls) for cls in token_embedding_repack(spec)),
        "attention": dict(cache["attention"]),
        "kv_layout": dict(cache["kv_layout"]),
    }


def spec_from_digest(data: Mapping[str, Any], shared: dict[int, tuple[Any, Any]] | None = None) -> tuple[ModelSpec, ModelSummary]:
    """The spec and summary :func:`spec_digest` kept, its tables restored. ``shared`` keeps what
    was made of plain values that several digests of one file hold as one object (every layer's
    repack classes, most often): pass the same dict for every digest read from one file.

    Raises:
        ValueError: not a digest of this version (the caller plans from the header instead).
    """
    if data.get("version") != DIGEST_VERSION:
        raise ValueError(f"not a version {DIGEST_VERSION} planning digest")
    memo = {} if shared is None else shared
    try:
        spec = ModelSpec(**data["spec"], tensors=TENSORS_NOT_KEPT)
        groups, ffn_width = data["matrix_groups"]
        spec.plan_cache.update(
            {
                "placement_groups": {None: tuple(_placement_group(group, memo) for group in data["placement_groups"])},
                "speed_groups": {None: (tuple(_record(MatrixGroup, group) for group in groups), ffn_width)},
                "largest_copies": {None: data["largest_copies"]},
                "token_embd_bytes": data["token_embd_bytes"],
                "token_embd_repack": _repack(data["token_embd_repack"], memo),
                "attention": dict(data["attention"]),
                "kv_layout": dict(data["kv_layout"]),
            }
        )
        return spec, _summary_from_plain(data["summary"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a damaged planning digest ({type(exc).__name__}: {exc})") from None


_Record = TypeVar("_Record", PlacementGroup, MatrixGroup, RepackClass)


def _record(kind: type[_Record], plain: tuple[Any, ...]) -> _Record:
    """``plain`` as the named tuple ``kind``, made directly (a catalog restores some 30,000)."""
    if type(plain) is not tuple or len(plain) != len(kind._fields):
        raise ValueError(f"a {kind.__name__} of {len(plain)} fields")
    return tuple.__new__(kind, plain)


def _repack(plain: tuple[Any, ...], memo: dict[int, tuple[Any, Any]]) -> tuple[RepackClass, ...]:
    known = memo.get(id(plain))
    if known is None or known[0] is not plain:  # an id is only as good as the object still there
        known = memo[id(plain)] = (plain, tuple(_record(RepackClass, cls) for cls in plain))
    return known[1]


def _placement_group(plain: tuple[Any, ...], memo: dict[int, tuple[Any, Any]]) -> PlacementGroup:
    return _record(PlacementGroup, (*plain[:-1], _repack(plain[-1], memo)))


def _summary_plain(summary: ModelSummary) -> dict[str, Any]:
    values = {f.name: getattr(summary, f.name) for f in fields(ModelSummary)}
    values["quant_mix"] = tuple(astuple(share) for share in summary.quant_mix)
    values["chat_template"] = astuple(summary.chat_template)
    return values


def _summary_from_plain(values: Mapping[str, Any]) -> ModelSummary:
    restored = dict(values)
    restored["quant_mix"] = tuple(QuantShare(*share) for share in values["quant_mix"])
    restored["chat_template"] = ChatTemplateInfo(*values["chat_template"])
    return ModelSummary(**restored)
