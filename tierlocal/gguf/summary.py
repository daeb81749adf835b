"""What ``tierlocal inspect`` reports: a summary of one model's GGUF header(s). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import HeaderError
from .chat_template import ChatTemplateInfo, chat_template_info
from .parse import ArraySummary, GGUFHeader, TensorInfo
from .tables import Keys, LlamaFileType

__all__ = ["QuantShare", "ModelSummary", "merge_split", "summarize"]


@dataclass(frozen=True)
class QuantShare:
    """Bytes and tensor count of one quantisation type in a model."""

    ggml_type: str
    tensors: int
    n_bytes: int
    n_elements: int


@dataclass(frozen=True)
class ModelSummary:
    """The facts a header states about a model. Sizes in bytes, counts in elements."""

    sources: tuple[str, ...]
    architecture: str
    name: str | None
    file_type: str | None
    params: int
    layers: int | None
    embedding_length: int | None
    head_count: int | list[int] | None
    head_count_kv: int | list[int] | None
    context_length: int | None
    vocab_size: int | None
    expert_count: int | None
    expert_used_count: int | None
    tensor_count: int
    tensor_bytes: int
    header_bytes: int
    file_bytes: int
    gguf_version: int
    quant_mix: tuple[QuantShare, ...] = field(default=())
    chat_template: ChatTemplateInfo = field(default=ChatTemplateInfo("absent"))
    #: tokenizer.ggml.model and tokenizer.ggml.pre (``gpt2`` / ``llama-bpe`` for Llama 3).
    tokenizer_model: str | None = None
    tokenizer_pre: str | None = None
    #: ``<arch>.pooling_type`` (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank); None: unset,
    #: as in a generation model's file.
    pooling_type: int | None = None

    @property
    def pooled_role(self) -> str | None:
        """What a file that names a pooling serves: ``rerank`` (4, rank) or ``embeddings`` (1 mean,
        2 cls, 3 last); None for a generation model's file (unset or 0, none)."""
        if not self.pooling_type:
            return None
        return "rerank" if self.pooling_type == 4 else "embeddings"

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--json`` (stable key names, sizes in bytes)."""
        return {
            "sources": list(self.sources),
            "architecture": self.architecture,
            "name": self.name,
            "file_type": self.file_type,
            "params": self.params,
            "layers": self.layers,
            "embedding_length": self.embedding_length,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "expert_count": self.expert_count,
            "expert_used_count": self.expert_used_count,
            "tensor_count": self.tensor_count,
            "tensor_bytes": self.tensor_bytes,
            "header_bytes": self.header_bytes,
            "file_bytes": self.file_bytes,
            "gguf_version": self.gguf_version,
            "quant_mix": [{"type": q.ggml_type, "tensors": q.tensors, "bytes": q.n_bytes, "elements": q.n_elements} for q in self.quant_mix],
            "tokenizer": {"model": self.tokenizer_model, "pre": self.tokenizer_pre},
            "chat_template": self.chat_template.to_json(),
        }


def _split_fields(header: GGUFHeader) -> tuple[int, int] | None:
    count = header.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT)
    number = header.metadata.get(Keys.Split.LLM_KV_SPLIT_NO)
    if count is None:
        return None
    if not isinstance(count, int) or not isinstance(number, int):
        raise HeaderError(header.source, 0, "split.count or split.no is not an integer")
    return number, count


def merge_split(headers: Sequence[GGUFHeader]) -> tuple[Mapping[str, object], tuple[TensorInfo, ...]]:
    """Combine the shards of a split GGUF into one metadata map and one tensor list.

    Metadata comes from the first shard (llama.cpp reads it from there too); tensors
    from every shard, in order. A single unsplit header is returned as it is.

    Raises:
        HeaderError: the shards do not belong together (wrong order, count or tensor total).
    """
    first = headers[0]
    split = _split_fields(first)
    if split is None or split[1] <= 1:
        if len(headers) != 1:
            raise HeaderError(first.source, 0, f"{len(headers)} files given but the first is not a split GGUF")
        return first.metadata, first.tensors
    expected = split[1]
    if len(headers) != expected:
        raise HeaderError(first.source, 0, f"split GGUF has {expected} shards but {len(headers)} were read")
    tensors: list[TensorInfo] = []
    for index, header in enumerate(headers):
        fields = _split_fields(header)
        if fields != (index, expected):
            raise HeaderError(header.source, 0, f"expected shard {index + 1} of {expected}, found {fields}")
        tensors.extend(header.tensors)
    total = first.metadata.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if isinstance(total, int) and total != len(tensors):
        raise HeaderError(first.source, 0, f"split.tensors.count says {total} tensors, the shards hold {len(tensors)}")
    names = [tensor.name for tensor in tensors]
    if len(set(names)) != len(names):
        raise HeaderError(first.source, 0, "the same tensor appears in more than one shard")
    return first.metadata, tuple(tensors)


def _arch_value(metadata: Mapping[str, object], arch: str, key_template: str) -> object:
    return metadata.get(key_template.format(arch=arch))


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_int_or_list(value: object) -> int | list[int] | None:
    if isinstance(value, list) and all(isinstance(item, int) for item in value):
        return value
    return _as_int(value)


def _file_type_name(value: object) -> str | None:
    if not isinstance(value, int):
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"unknown ({value})"


def _vocab_size(metadata: Mapping[str, object], arch: str) -> int | None:
    tokens = metadata.get(Keys.Tokenizer.LIST)
    if isinstance(tokens, ArraySummary):
        return tokens.length
    if isinstance(tokens, list):
        return len(tokens)
    return _as_int(_arch_value(metadata, arch, Keys.LLM.VOCAB_SIZE))


def summarize(headers: Sequence[GGUFHeader]) -> ModelSummary:
    """Summarise one model from its header(s): one file, or every shard of a split file in order.

    Raises:
        HeaderError: the header has no ``general.architecture`` or the shards do not match.
    """
    metadata, tensors = merge_split(headers)
    arch = metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        raise HeaderError(headers[0].source, 0, "general.architecture is missing")
    by_type: dict[str, list[int]] = {}
    for tensor in tensors:
        share = by_type.setdefault(tensor.ggml_type, [0, 0, 0])
        share[0] += 1
        share[1] += tensor.n_bytes
        share[2] += tensor.n_elements
    quant_mix = tuple(
        QuantShare(name, count, n_bytes, n_elements) for name, (count, n_bytes, n_elements) in sorted(by_type.items(), key=lambda item: -item[1][1])
    )
    name = metadata.get(Keys.General.NAME)
    tokenizer_model, tokenizer_pre = metadata.get(Keys.Tokenizer.MODEL), metadata.get(Keys.Tokenizer.PRE)
    return ModelSummary(
        sources=tuple(header.source for header in headers),
        architecture=arch,
        name=name if isinstance(name, str) else None,
        file_type=_file_type_name(metadata.get(Keys.General.FILE_TYPE)),
        params=sum(tensor.n_elements for tensor in tensors),
        layers=_as_int(_arch_value(metadata, arch, Keys.LLM.BLOCK_COUNT)),
        embedding_length=_as_int(_arch_value(metadata, arch, Keys.LLM.EMBEDDING_LENGTH)),
        head_count=_as_int_or_list(_arch_value(metadata, arch, Keys.Attention.HEAD_COUNT)),
        head_count_kv=_as_int_or_list(_arch_value(metadata, arch, Keys.Attention.HEAD_COUNT_KV)),
        context_length=_as_int(_arch_value(metadata, arch, Keys.LLM.CONTEXT_LENGTH)),
        vocab_size=_vocab_size(metadata, arch),
        expert_count=_as_int(_arch_value(metadata, arch, Keys.LLM.EXPERT_COUNT)),
        expert_used_count=_as_int(_arch_value(metadata, arch, Keys.LLM.EXPERT_USED_COUNT)),
        tensor_count=len(tensors),
        tensor_bytes=sum(tensor.n_bytes for tensor in tensors),
        header_bytes=sum(header.header_bytes for header in headers),
        file_bytes=sum(header.file_bytes for header in headers),
        gguf_version=headers[0].version,
        quant_mix=quant_mix,
        chat_template=chat_template_info(headers),
        tokenizer_model=tokenizer_model if isinstance(tokenizer_model, str) else None,
        tokenizer_pre=tokenizer_pre if isinstance(tokenizer_pre, str) else None,
        pooling_type=_as_int(_arch_value(metadata, arch, Keys.LLM.POOLING_TYPE)),
    )
