"""What ``tierlocal plan MODEL`` knows about MODEL: a frontier or catalog model from recipes/,
a GGUF source (header only), or ``hf://OWNER/REPO`` of a safetensors repo (parameter counts
from the safetensors headers, attention design from config.json)."""

from __future__ import annotations

from collections.abc import Mapping

from ..catalog import FrontierModel, GpuSpec, find_frontier, find_gpu, find_model, load_gpus
from ..errors import CatalogError, SourceError
from ..fetch.hub import read_safetensors_model
from ..fetch.sources import read_headers
from ..fit.recurrent import frontier_per_user_memory
from ..gguf import summarize
from ..gguf.summary import ModelSummary
from ..hardware.override import parse_gpu_override
from .arithmetic import GpuOption
from .launch import LaunchRecipe, launch_recipe_from
from .plan import ModelFacts
from .throughput import PublishedThroughput

__all__ = ["resolve_model_facts", "facts_from_config", "gpu_options"]

_GGUF_PRECISION = {"F32": "bf16", "F16": "bf16", "BF16": "bf16", "Q8_0": "fp8", "Q2_K": "2bit", "Q2_K_S": "2bit"}
_SAFETENSORS_PRECISION = {"BF16": "bf16", "F16": "bf16", "F32": "bf16", "F8_E4M3": "fp8", "F8_E5M2": "fp8"}
_NON_CLASSIC_KEYS = ("sliding_window", "kv_lora_rank", "ssm.", "wkv.", "shortconv.", "full_attention_interval")


def _launch_recipe(model: FrontierModel) -> LaunchRecipe:
    """``[model.launch]`` read, or a one-line error naming the entry."""
    try:
        return launch_recipe_from(model.launch)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CatalogError(f"recipes/frontier.toml: {model.name}'s [model.launch] is malformed ({exc!r})", hint="fix the entry") from None


def _frontier_facts(model: FrontierModel) -> ModelFacts:
    kv_per_token, state = frontier_per_user_memory(model.attention_dims, model.attention_layers)
    example = model.classic_example
    classic = None
    if example:
        classic = (int(example["layers"]), int(example["kv_heads"]), int(example["head_dim"]), float(example["bytes_per_element"]))
    return ModelFacts(
        name=model.name,
        display_name=model.display_name,
        params=model.params,
        active_params=model.active_params,
        precision=model.shipped_precision,
        layers=model.layers,
        context_length=model.context_length,
        kv_bytes_per_token=kv_per_token,
        fixed_state_bytes=state,
        kv_unknown_reason=None if model.kv_published else model.kv_unknown_reason,
        classic_example=classic,
        shipped_bytes=model.repo_bytes,
        serving_floor_bytes=model.serving_floor_bytes,
        disk_to_plan_bytes=model.disk_to_plan_bytes,
        published_configs=model.published_configs,
        guidance=model.guidance,
        vllm_notes=model.vllm_notes,
        launch_recipe=_launch_recipe(model),
        experts=model.experts,
        experts_per_token=model.experts_per_token,
        published_throughput=tuple(
            PublishedThroughput(str(p["engine"]), int(p["gpus"]), int(p["users"]), float(p["tokens_per_s"]), str(p["source"]))  # type: ignore[call-overload, arg-type]
            for p in model.published_throughput
        ),
        sources=(f"{model.display_name} facts: {model.source} ({model.facts_date})",)
        + ((f"{model.display_name} attention and state dimensions: {model.attention_dims_source}",) if model.attention_dims_source else ())
        + ((f"{model.display_name} launch flags: {model.launch['source']}",) if model.launch.get("source") else ()),
    )


def _gguf_facts(source: str, summary: ModelSummary, metadata: Mapping[str, object]) -> ModelFacts:
    arch = summary.architecture
    kv_per_token: float | None = None
    reason = None
    special = [key for key in metadata if key.startswith(f"{arch}.") and any(marker in key for marker in _NON_CLASSIC_KEYS)]
    kv_heads = summary.head_count_kv
    if special or isinstance(kv_heads, list):
        reason = (
            f"{arch} has sliding-window, latent (MLA) or recurrent layers ({', '.join(special) or 'per-layer KV heads'}); the classic "
            "formula does not apply"
        )
    elif summary.layers and isinstance(kv_heads, int) and isinstance(summary.head_count, int) and summary.embedding_length:
        key_length = metadata.get(f"{arch}.attention.key_length") or summary.embedding_length // summary.head_count
        value_length = metadata.get(f"{arch}.attention.value_length") or key_length
        assert isinstance(key_length, int) and isinstance(value_length, int)
        kv_per_token = summary.layers * kv_heads * (key_length + value_length) * 2.0
    else:
        reason = "the header does not state the attention shape"
    return ModelFacts(
        name=summary.name or source,
        display_name=summary.name or source,
        params=summary.params,
        active_params=summary.params,
        precision=_GGUF_PRECISION.get(summary.file_type or "", "int4" if (summary.file_type or "").startswith(("Q4", "IQ4", "MXFP4")) else "bf16"),
        layers=summary.layers,
        context_length=summary.context_length,
        kv_bytes_per_token=kv_per_token,
        kv_unknown_reason=reason,
        shipped_bytes=summary.file_bytes,
        sources=(f"GGUF header of {source}",),
    )


def facts_from_config(name: str, params: int, precision: str, config: Mapping[str, object]) -> ModelFacts:
    """Facts from a Hugging Face ``config.json`` (transformers keys) and a parameter count."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = {**config, **text}
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None)
    kv_per_token: float | None = None
    reason = None
    if isinstance(layers, int) and isinstance(config.get("kv_lora_rank"), int):
        latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)  # type: ignore[call-overload]
        kv_per_token = layers * latent * 2.0  # MLA: one compressed latent per layer, f16
    elif config.get("sliding_window") or config.get("layer_types"):
        reason = "config.json declares sliding-window or mixed layer types; the classic formula would overstate the KV cache"
    elif all(isinstance(v, int) for v in (layers, kv_heads, head_dim)):
        kv_per_token = 2 * layers * kv_heads * head_dim * 2.0  # type: ignore[operator]
    else:
        reason = "config.json does not state the attention shape"
    context = config.get("max_position_embeddings")
    return ModelFacts(
        name=name,
        display_name=name,
        params=params,
        active_params=params,
        precision=precision,
        layers=layers if isinstance(layers, int) else None,
        context_length=context if isinstance(context, int) else None,
        kv_bytes_per_token=kv_per_token,
        kv_unknown_reason=reason,
        sources=(f"{name}: safetensors headers and config.json",),
    )


def _hub_facts(source: str) -> ModelFacts:
    spec = source.removeprefix("hf://")
    repo_id, _, revision = spec.partition("@")
    if repo_id.count("/") != 1:
        raise SourceError(source, "expected hf://OWNER/REPO of a safetensors repo", hint="for a GGUF file write hf://OWNER/REPO/FILE.gguf")
    counts, config = read_safetensors_model(source, repo_id, revision or None)
    params = sum(counts.values())
    dominant = max(counts, key=lambda dtype: counts[dtype]) if counts else "BF16"
    return facts_from_config(repo_id, params, _SAFETENSORS_PRECISION.get(dominant, "bf16"), config)


def resolve_model_facts(model: str) -> ModelFacts:
    """Facts for MODEL: a recipes name (frontier or catalog family), a GGUF source, or hf://OWNER/REPO.

    Raises:
        SourceError, HeaderError, UsageError: the model cannot be read.
    """
    frontier = find_frontier(model)
    if frontier is not None:
        return _frontier_facts(frontier)
    entries = find_model(model)
    if entries:
        entry = entries[0]
        return ModelFacts(
            name=entry.family,
            display_name=entry.family,
            params=entry.params,
            active_params=entry.active_params,
            precision="bf16",
            layers=entry.layers,
            context_length=entry.context_length,
            kv_bytes_per_token=entry.kv_bytes_per_token,
            fixed_state_bytes=entry.fixed_state_bytes,
            sources=(f"{entry.family} facts: recipes/models.toml ({entry.facts_date})",),
        )
    if model.startswith("hf://") and not model.split("@")[0].endswith(".gguf"):
        return _hub_facts(model)
    if "/" not in model and not model.endswith(".gguf"):
        raise SourceError(model, "not a model in the catalog, nor a GGUF path", hint="see recipes/models.toml and recipes/frontier.toml for names")
    headers = read_headers(model)
    return _gguf_facts(model, summarize(headers), headers[0].metadata)


def gpu_options(values: tuple[str, ...]) -> tuple[tuple[GpuOption, ...], list[GpuSpec]]:
    """The GPUs a plan sizes with: those ``--gpu`` names (or sizes), else every datacenter GPU
    in recipes/gpus.toml; with the recipes entries they came from (for the sources list)."""
    if values:
        devices = parse_gpu_override(values)
        unique = {device.name.split(" #")[0]: device.total_bytes for device in devices}
        named = {name: spec for name in unique if (spec := find_gpu(name)) is not None}
        options = tuple(_option(named[name]) if name in named else GpuOption(name, memory) for name, memory in unique.items())
        return options, list(named.values())
    specs = [spec for spec in load_gpus() if spec.datacenter]
    return tuple(_option(spec) for spec in specs), specs


def _option(spec: GpuSpec) -> GpuOption:
    """A recipes GPU as plans size with it: marketed memory, and usable memory where read."""
    return GpuOption(spec.name, spec.marketed_bytes, spec.usable_bytes, spec.bandwidth_bytes_per_s)
