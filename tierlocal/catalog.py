"""Loads the dated facts in recipes/ (GPUs, models, frontier models, hosted APIs, precisions).
The files are data, not code.

Over 400 lines because every recipes/ file's record type sits beside its loader and field
checks: this module is the one place that knows the files' format (units, required fields,
the error that names the file), and splitting it per file would spread that knowledge out.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from .cache_file import cached
from .errors import CatalogError
from .gguf.compact import from_compact
from .gguf.parse import GGUFHeader
from .published import (
    LICENCE_USES,
    AnswerLength,
    AnswerLengths,
    ApiPrices,
    CardInfo,
    CpuBenchRow,
    LicenceTerms,
    ModelShape,
    ModeRule,
    ModeWords,
    Precision,
    PublishedConfig,
    PublishedRow,
    QualityFigure,
    QualityRules,
    QuantLoss,
    RentalOffer,
    VersionRule,
    weights_bytes,
)

__all__ = [
    "load_rental_offers",
    "load_answer_lengths",
    "load_batch_shares",
    "load_expert_batch_reads",
    "load_expert_grouped_from",
    "load_expert_tile_tokens",
    "load_overhead_layer_share",
    "REASONING_EFFORTS",
    "catalog_reasoning_effort",
    "EFFORT_MODES",
    "load_licences",
    "load_cpu_rows",
    "gpu_key",
    "find_pci_device",
    "gpu_named_in",
    "load_published_rows",
    "gpu_cards",
    "ApiEntry",
    "FrontierModel",
    "PublishedConfig",
    "load_apis",
    "load_frontier",
    "load_precisions",
    "find_frontier",
    "GpuSpec",
    "HostDefaults",
    "load_host_defaults",
    "RentalDefaults",
    "Rack",
    "load_racks",
    "load_rental_defaults",
    "ModelEntry",
    "CATALOG_ROLES",
    "QualityFacts",
    "load_quality",
    "load_entry_headers",
    "recipes_dir",
    "load_gpus",
    "find_gpu",
    "load_models",
    "find_model",
]

_GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model from recipes/gpus.toml. Memory in bytes, bandwidth in bytes/s.

    ``memory_bytes`` is what ``--gpu NAME`` plans with (the vendor figure read as GiB);
    ``marketed_bytes`` the vendor's size in decimal GB, as the guides count GPUs;
    ``usable_bytes`` what the driver reports, where a dated reading exists."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    memory_bytes: int
    bandwidth_bytes_per_s: int
    datacenter: bool
    usd_per_hour: tuple[float, float] | None
    spec_date: str
    marketed_bytes: int = 0
    usable_bytes: int | None = None
    usable_source: str | None = None
    #: PCI device ids (``0x56a0``) where the driver's files do not name the card.
    pci_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnifiedSpec:
    """A machine whose GPU and CPU share one pool of RAM (Apple Silicon, AMD Strix Halo, NVIDIA
    DGX Spark): its memory bandwidth (bytes/s), the RAM sizes it is sold with (GB; empty: not
    on record, any size is taken) and the share of that pool its GPU may use by default
    (:meth:`gpu_share`)."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    backend: str
    bandwidth_bytes_per_s: int
    memory_options_gb: tuple[int, ...]
    spec_date: str
    source: str
    #: The GPU's share of the pool where the vendor publishes one (None: Apple's Metal rule).
    gpu_share_fixed: float | None = None
    #: Apple's Metal working set, as devices report it: this share up to 36 GB of RAM, the other above.
    metal_shares: tuple[float, float] = (2 / 3, 3 / 4)
    #: PCI device ids (``0x1586``) of its GPU, where the driver's files do not name it.
    pci_ids: tuple[str, ...] = ()

    def gpu_share(self, ram_bytes: int) -> float:
        """The share of ``ram_bytes`` the GPU may use by default."""
        if self.gpu_share_fixed is not None:
            return self.gpu_share_fixed
        return self.metal_shares[0] if ram_bytes <= 36 * 2**30 else self.metal_shares[1]


@dataclass(frozen=True)
class Rack:
    """A rack sold as one system (GB300 NVL72): ``count`` of ``gpu``, memory in bytes (decimal, as marketed)."""

    name: str
    gpu: str
    count: int
    memory_bytes: int
    spec_date: str
    source: str


@dataclass(frozen=True)
class DeviceLimit:
    """A device whose largest bindable buffer is small: tensors above ``max_buffer_bytes``
    stay on the CPU. ``match`` is a substring of the driver's device name."""

    match: str
    max_buffer_bytes: int


@dataclass(frozen=True)
class ModelEntry:
    """One model (one quantisation) from recipes/models.toml.

    Sizes in bytes; ``kv_bytes_per_token`` is the f16 KV cache of one token over all layers
    (None where the attention design is not published); ``fixed_state_bytes`` is the
    per-sequence recurrent/linear-attention state that does not grow with context.
    ``file_bytes`` is a measured file size where ``file_bytes_measured``, else
    params × bits_per_weight / 8. ``floor_bytes`` is the memory the weights need at least:
    the file for a GGUF, params × nominal bytes per weight for a frontier model (as the
    published tables count it, without block scales).
    """

    key: str
    family: str
    params: int
    active_params: int
    quant: str
    bits_per_weight: float
    file_bytes: int
    file_bytes_measured: bool
    floor_bytes: int
    layers: int
    context_length: int
    kv_bytes_per_token: int | None
    fixed_state_bytes: int
    frontier: bool
    ollama: str | None
    gguf_repo: str | None
    licence: str
    facts_date: str
    note: str
    #: The family it belongs to (``Qwen3``), llama.cpp's architecture and the published config
    #: its shape comes from (its quality figures are in recipes/quality.toml: :func:`load_quality`).
    series: str = ""
    architecture: str = ""
    source: str = ""
    #: The compact header file in recipes/headers/ (None: planned by the rule of thumb).
    header_file: str | None = None
    #: What it serves: ``chat`` (a generation model: chat, code, reasoning) or ``embeddings``
    #: (vectors, ranked by ``check --for embeddings`` and never among the chat models).
    role: str = "chat"
    #: The reasoning effort its thinking figures are at and its thinking mode asks the chat
    #: template for (gpt-oss: ``high``; the template's own default is ``medium``); None: no levels.
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class RentalDefaults:
    """The on-demand rental price range in USD per GPU-hour, the rate plans use by default
    (the guides' own), with their date and source."""

    low: float
    high: float
    default: float
    date: str
    source: str


@dataclass(frozen=True)
class HostDefaults:
    """Planning assumptions from recipes/gpus.toml ``[host]``: bandwidth in bytes/s, sizes in bytes."""

    assumed_ram_bandwidth_bytes_per_s: int
    runtime_overhead_bytes: int
    fit_margin_bytes: int
    gpu_runtime_overhead_bytes: int
    date: str


@dataclass(frozen=True)
class FrontierModel:
    """A model no single machine holds (recipes/frontier.toml). Sizes in bytes."""

    name: str
    display_name: str
    facts_date: str
    source: str
    licence: str
    params: int
    active_params: int
    layers: int
    context_length: int
    shipped_precision: str
    repo_bytes: int
    repo_shards: int
    serving_floor_bytes: int
    disk_to_plan_bytes: int
    engines: tuple[str, ...]
    no_support: str
    kv_published: bool
    kv_unknown_reason: str
    attention_layers: dict[str, int]
    classic_example: dict[str, float]
    #: Published attention and state dimensions (MLA ranks, KDA heads …) and where they come from.
    attention_dims: dict[str, int]
    attention_dims_source: str
    published_configs: tuple[PublishedConfig, ...]
    guidance: dict[str, str]
    vllm_notes: dict[str, str]
    #: ``[model.launch]`` as written: the engines' published flags per GPU family (tiers.launch reads it).
    launch: dict[str, object]
    #: ``[model.single_machine]`` as written: published GGUFs with the experts in RAM (plan.single_machine reads it).
    single_machine: dict[str, object]
    #: Routed experts per MoE layer and per token (None: not published, or dense).
    experts: int | None = None
    experts_per_token: int | None = None
    #: ``[[model.published_throughput]]`` as written: an engine's decode per user on N GPUs.
    published_throughput: tuple[dict[str, object], ...] = ()


@dataclass(frozen=True)
class ApiEntry:
    """A hosted API for a model (recipes/apis.toml): prices in USD per million tokens."""

    name: str
    model: str
    base_url: str
    model_id: str
    key_env: str
    prices: ApiPrices
    prices_date: str
    source: str
    #: The protocols its ``base_url`` answers (the gateway's ``speaks``), with where that is written.
    speaks: tuple[str, ...] = ("chat_completions",)
    speaks_source: str = ""


def recipes_dir() -> Path:
    """recipes/ beside the package in a source tree, or the copy packed inside the wheel."""
    packed = Path(__file__).parent / "_recipes"
    if packed.is_dir():
        return packed
    source_tree = Path(__file__).parent.parent / "recipes"
    if source_tree.is_dir():
        return source_tree
    raise CatalogError("the recipes/ data is missing from this installation", hint="reinstall tierlocal")


@cache
def _load(name: str) -> dict[str, object]:
    """recipes/NAME parsed, once per process (several loaders read gpus.toml; none changes it)
    and kept in the cache file between runs (:mod:`tierlocal.cache_file`)."""
    return cached(f"recipes/{name}", lambda: _parse(name))


def _parse(name: str) -> dict[str, object]:
    path = recipes_dir() / name
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", hint="reinstall tierlocal or fix the file") from None


def normalise_gpu_name(name: str) -> str:
    """Lower case, dashes and underscores as spaces, single spaces: ``RTX-4090`` → ``rtx 4090``."""
    return " ".join(name.lower().replace("-", " ").replace("_", " ").split())


def load_device_limits() -> tuple[DeviceLimit, ...]:
    """The [[device_limit]] entries of recipes/gpus.toml."""
    data = _load("gpus.toml")
    try:
        return tuple(DeviceLimit(str(entry["match"]), int(entry["max_buffer_mib"]) * 1024 * 1024) for entry in data.get("device_limit", []))  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/gpus.toml: a device_limit lacks {exc}", hint="fix the entry") from None


@cache
def load_gpus() -> tuple[GpuSpec, ...]:
    """Every GPU in recipes/gpus.toml.

    Raises:
        CatalogError: the file is missing or an entry lacks a field.
    """
    data = _load("gpus.toml")
    specs = []
    try:
        for entry in data["gpu"]:  # type: ignore[attr-defined]
            price = entry.get("usd_per_hour")
            specs.append(
                GpuSpec(
                    name=entry["name"],
                    aliases=tuple(entry.get("aliases", ())),
                    vendor=entry["vendor"],
                    memory_bytes=int(entry["memory_gib"] * _GIB),
                    bandwidth_bytes_per_s=int(entry["bandwidth_gb_s"] * 1e9),
                    datacenter=bool(entry.get("datacenter", False)),
                    usd_per_hour=(float(price[0]), float(price[1])) if price else None,
                    spec_date=entry["spec_date"],
                    marketed_bytes=int(entry["memory_gb"] * 1e9),
                    usable_bytes=int(entry["usable_mib"]) * 1024 * 1024 if "usable_mib" in entry else None,
                    usable_source=entry.get("usable_source"),
                    pci_ids=tuple(str(pci).lower() for pci in entry.get("pci_ids", ())),
                )
            )
    except (KeyError, TypeError, IndexError) as exc:
        raise CatalogError(f"recipes/gpus.toml: an entry lacks {exc}", hint="fix the entry") from None
    return tuple(specs)


@cache
def load_unified() -> tuple[UnifiedSpec, ...]:
    """Every unified-memory machine in recipes/gpus.toml [[unified]].

    Raises:
        CatalogError: an entry lacks a field.
    """
    data = _load("gpus.toml")
    metal: dict[str, object] = data.get("apple_metal_working_set", {})  # type: ignore[assignment]
    shares = (float(metal.get("fraction_up_to_36gb", 2 / 3)), float(metal.get("fraction_above_36gb", 3 / 4)))  # type: ignore[arg-type]
    try:
        return tuple(
            UnifiedSpec(
                name=entry["name"],
                aliases=tuple(entry.get("aliases", ())),
                vendor=entry["vendor"],
                backend=entry["backend"],
                bandwidth_bytes_per_s=int(float(entry["bandwidth_gb_s"]) * 1e9),
                memory_options_gb=tuple(int(size) for size in entry.get("memory_options_gb", ())),
                spec_date=entry["spec_date"],
                source=entry["source"],
                gpu_share_fixed=float(entry["gpu_share"]) if "gpu_share" in entry else None,
                metal_shares=shares,
                pci_ids=tuple(str(pci).lower() for pci in entry.get("pci_ids", ())),
            )
            for entry in data.get("unified", [])  # type: ignore[attr-defined]
            if "bandwidth_gb_s" in entry
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/gpus.toml [[unified]]: an entry lacks {exc}", hint="fix the entry") from None


def find_pci_device(vendor: str, device_id: str) -> GpuSpec | UnifiedSpec | None:
    """The GPU or unified-memory machine of ``vendor`` (``amd``, ``intel``) whose PCI device id
    is ``device_id`` (``0x1586``, as sysfs writes it), if recipes/gpus.toml lists it."""
    wanted = device_id.strip().lower()
    specs: list[GpuSpec | UnifiedSpec] = [*load_gpus(), *load_unified()]
    return next((spec for spec in specs if spec.vendor == vendor and wanted in spec.pci_ids), None)


def gpu_named_in(description: str) -> GpuSpec | UnifiedSpec | None:
    """The GPU or unified-memory machine whose longest name or alias appears, as whole words,
    in a device name a driver or engine reports (``NVIDIA GeForce RTX 4090``, ``Radeon 8060S
    Graphics (RADV GFX1151)``, ``RTX 3090 #1``); None when none does."""
    text = f" {normalise_gpu_name(description)} "
    best: tuple[int, GpuSpec | UnifiedSpec] | None = None
    specs: list[GpuSpec | UnifiedSpec] = [*load_gpus(), *load_unified()]
    for spec in specs:
        for alias in (spec.name, *spec.aliases):
            needle = f" {normalise_gpu_name(alias)} "
            if needle in text and (best is None or len(needle) > best[0]):
                best = (len(needle), spec)
    return best[1] if best else None


def find_unified(name: str) -> UnifiedSpec | None:
    """The unified-memory machine ``name`` names (case, spaces and punctuation ignored)."""
    wanted = gpu_key(name)
    return next((spec for spec in load_unified() if wanted in {gpu_key(spec.name), *(gpu_key(alias) for alias in spec.aliases)}), None)


@cache
def load_racks() -> tuple[Rack, ...]:
    """The [[rack]] entries of recipes/gpus.toml.

    Raises:
        CatalogError: an entry lacks a field.
    """
    try:
        return tuple(
            Rack(r["name"], r["gpu"], int(r["count"]), int(r["memory_gb"] * 1e9), str(r["spec_date"]), r["source"])
            for r in _load("gpus.toml").get("rack", [])  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/gpus.toml: a rack lacks {exc}", hint="fix the entry") from None


@cache
def load_host_defaults() -> HostDefaults:
    """The ``[host]`` planning assumptions in recipes/gpus.toml.

    Raises:
        CatalogError: the section or a field is missing.
    """
    try:
        host = _load("gpus.toml")["host"]
        return HostDefaults(
            assumed_ram_bandwidth_bytes_per_s=int(host["assumed_ram_bandwidth_gb_s"] * 1e9),  # type: ignore[index]
            runtime_overhead_bytes=int(host["runtime_overhead_gib"] * _GIB),  # type: ignore[index]
            fit_margin_bytes=int(host["fit_margin_mib"] * 1024 * 1024),  # type: ignore[index]
            gpu_runtime_overhead_bytes=int(host["gpu_runtime_overhead_mib"] * 1024 * 1024),  # type: ignore[index]
            date=str(host["date"]),  # type: ignore[index]
        )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"recipes/gpus.toml [host] lacks {exc}", hint="fix the file") from None


@cache
def load_rental_defaults() -> RentalDefaults:
    """The ``[rental]`` section of recipes/gpus.toml."""
    try:
        rental = _load("gpus.toml")["rental"]
        low, high = rental["usd_per_gpu_hour"]  # type: ignore[index]
        default = float(rental["default_usd_per_gpu_hour"])  # type: ignore[index]
        return RentalDefaults(float(low), float(high), default, str(rental["date"]), str(rental["source"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/gpus.toml [rental] lacks {exc}", hint="fix the file") from None


@cache
def load_rental_offers() -> tuple[RentalOffer, ...]:
    """recipes/gpu_rental.toml's offers of the cards of recipes/gpus.toml, per GPU-hour (an
    instance's price over its GPUs where the page states no per-GPU price)."""
    offers = []
    listed = _load("gpu_rental.toml").get("offer", [])
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict) or "card" not in entry:
            continue
        per_gpu = entry.get("per_gpu_usd_per_hour") or entry.get("per_gpu_derived")
        if per_gpu is None and entry.get("price_usd_per_hour") is not None:
            per_gpu = float(entry["price_usd_per_hour"]) / max(int(entry.get("gpus_per_instance") or 1), 1)
        if per_gpu is None or entry.get("aggregator"):
            continue
        offers.append(
            RentalOffer(
                str(entry["card"]),
                float(per_gpu),
                str(entry.get("billing", "")),
                str(entry.get("provider", "")),
                str(entry.get("date", "")),
                str(entry.get("source", "")),
            )
        )
    return tuple(offers)


@cache
def load_batch_shares() -> dict[str, float]:
    """recipes/batched_bench.toml's fitted batch FLOP share per GPU backend (lower case: ``cuda``,
    ``metal``), the figure :mod:`tierlocal.fit.concurrency` prices a decode step's further
    sequences with."""
    try:
        fit = _load("batched_bench.toml")["fit"]
        shares = fit["batch_flops_share"] if isinstance(fit, dict) else {}
        return {str(backend).lower(): float(share) for backend, share in shares.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CatalogError(f"recipes/batched_bench.toml [fit] lacks {exc}", hint="run python -m bench.concurrency_published --write") from None


@cache
def load_expert_batch_reads() -> float:
    """recipes/batched_bench.toml's fitted times a GPU's prompt batch streams the experts it touches
    (:attr:`tierlocal.fit.device_speed.DeviceSpeed.expert_batch_reads`; 0 when not fitted)."""
    fit = _load("batched_bench.toml").get("fit")
    value = fit.get("expert_batch_reads", 0.0) if isinstance(fit, dict) else 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise CatalogError("recipes/batched_bench.toml [fit] expert_batch_reads is not a number ≥ 0", hint="fix the entry")
    return float(value)


@cache
def load_overhead_layer_share() -> float:
    """recipes/gpu_speed.toml's [fit] ``overhead_layer_share``: the share of a GPU backend's
    decode overhead that is paid per layer (:func:`tierlocal.fit.gpu_speed.overhead_scale`); 0
    when not stated."""
    fit = _load("gpu_speed.toml").get("fit")
    value = fit.get("overhead_layer_share", 0.0) if isinstance(fit, dict) else 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise CatalogError("recipes/gpu_speed.toml [fit] overhead_layer_share is not a number from 0 to 1", hint="fix the entry")
    return float(value)


def _kernel_tokens(entry: str) -> dict[str, int]:
    """recipes/batched_bench.toml's [kernels] ``entry``: a token count per GPU backend (lower case)."""
    kernels = _load("batched_bench.toml").get("kernels", {})
    table = kernels.get(entry, {}) if isinstance(kernels, dict) else {}
    if not isinstance(table, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096 for v in table.values()):
        raise CatalogError(f"recipes/batched_bench.toml [kernels] {entry} is not a table of token counts 1-4096", hint="fix the entry")
    return {str(backend).lower(): int(tokens) for backend, tokens in table.items()}


@cache
def load_expert_grouped_from() -> dict[str, int]:
    """recipes/batched_bench.toml's [kernels]: from how many tokens each GPU backend (lower case)
    reads an expert once for all the tokens routed to it
    (:attr:`tierlocal.fit.device_speed.DeviceSpeed.expert_grouped_from`); a backend not named: 1."""
    return _kernel_tokens("expert_grouped_from")


@cache
def load_expert_tile_tokens() -> dict[str, int]:
    """recipes/batched_bench.toml's [kernels]: the tokens of one tile of each GPU backend's grouped
    expert mat-mul, which runs whole for an expert given fewer
    (:attr:`tierlocal.fit.device_speed.DeviceSpeed.expert_tile_tokens`); a backend not named: 0."""
    return _kernel_tokens("expert_tile_tokens")


@cache
def load_published_rows() -> tuple[PublishedRow, ...]:
    """The [[row]] entries of recipes/gpu_speed.toml, each with its model's [[shape]]: published
    llama-bench speed per GPU.

    Raises:
        CatalogError: an entry lacks a field or names a shape the file does not have.
    """
    data = _load("gpu_speed.toml")
    try:
        shapes = _shapes(data)
        return tuple(
            PublishedRow(
                gpu=str(entry["gpu"]),
                shape=shapes[entry["shape"]],
                model=str(entry["model"]),
                size_bytes=int(float(entry["size_gib"]) * _GIB),
                test=str(entry["test"]),
                tokens_per_s=float(entry["tokens_per_s"]),
                use=str(entry["use"]),
                source=str(entry["source"]),
                date=str(entry["date"]),
            )
            for entry in data.get("row", [])  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/gpu_speed.toml: a row lacks {exc}", hint="fix the entry") from None


def _shapes(data: dict[str, object]) -> dict[str, ModelShape]:
    """A speed file's [[shape]] entries by name."""
    return {
        entry["name"]: ModelShape(
            entry["name"],
            int(entry["params"]),
            int(entry["active_params"]),
            int(entry["embedding_params"]),
            int(entry.get("read_bytes_per_token", 0)),
            int(float(entry.get("read_file_gib", 0)) * _GIB),
            int(entry.get("n_layer", 0)),
        )
        for entry in data.get("shape", [])  # type: ignore[attr-defined]
    }


@cache
def load_cpu_rows() -> tuple[CpuBenchRow, ...]:
    """The [[row]] entries of recipes/cpu_speed.toml with their [[shape]]: published llama-bench
    speed of CPUs alone.

    Raises:
        CatalogError: an entry lacks a field or names a shape the file does not have.
    """
    data = _load("cpu_speed.toml")
    try:
        shapes = _shapes(data)
        return tuple(
            CpuBenchRow(
                cpu=str(entry["cpu"]),
                vendor=str(entry["vendor"]),
                isa=str(entry["isa"]),
                threads=int(entry["threads"]),
                bandwidth_bytes_per_s=float(entry["bandwidth_gb_s"]) * 1e9,
                shape=shapes[entry["shape"]],
                size_bytes=int(float(entry["size_gb"]) * 1e9),
                pp512=float(entry["pp512"]),
                tg128=float(entry["tg128"]),
                use=str(entry["use"]),
                source=str(entry["source"]),
                date=str(entry["date"]),
            )
            for entry in data.get("row", [])  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/cpu_speed.toml: a row lacks {exc}", hint="fix the entry") from None


@cache
def gpu_cards() -> dict[str, CardInfo]:
    """Every GPU and unified-memory machine of recipes/gpus.toml as the speed model sees it."""
    data = _load("gpus.toml")
    cards = {}
    for entry in [*data.get("gpu", []), *data.get("unified", [])]:  # type: ignore[misc]
        if "bandwidth_gb_s" not in entry:
            continue
        flops = entry.get("fp16_tflops")
        cards[entry["name"]] = CardInfo(
            entry["name"],
            int(float(entry["bandwidth_gb_s"]) * 1e9),
            float(flops) * 1e12 if flops else None,
            entry.get("architecture", ""),
            entry.get("backend", ""),
        )
    return cards


def gpu_key(name: str) -> str:
    """A GPU name with case, spaces and punctuation dropped: ``RTX-4090`` and ``rtx4090`` → ``rtx4090``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_gpu(name: str) -> GpuSpec | None:
    """The GPU whose name or alias matches ``name`` (case, spaces and punctuation ignored)."""
    wanted = gpu_key(name)
    for spec in load_gpus():
        if wanted in {gpu_key(spec.name), *(gpu_key(alias) for alias in spec.aliases)}:
            return spec
    return None


def close_gpu_names(name: str, limit: int = 3) -> list[str]:
    """Names of the known GPUs and unified-memory machines nearest to ``name`` (a misspelling's
    likely meaning), best first."""
    labels = [(label, spec.name) for spec in load_gpus() for label in (spec.name, *spec.aliases)]
    labels += [
        (label, f"{spec.name} {spec.memory_options_gb[-1] if spec.memory_options_gb else 64}GB")
        for spec in load_unified()
        for label in (spec.name, *spec.aliases)
    ]
    by_key = {gpu_key(label): shown for label, shown in labels}
    matches = difflib.get_close_matches(gpu_key(name), list(by_key), n=limit * 3, cutoff=0.6)
    return list(dict.fromkeys(by_key[key] for key in matches))[:limit]


@cache
def load_models() -> tuple[ModelEntry, ...]:
    """Every model entry in recipes/models.toml, one per family × quantisation.

    Raises:
        CatalogError: the file is missing or an entry lacks a field.
    """
    data = _load("models.toml")
    entries = []
    try:
        quant_bits: dict[str, float] = {k: v for k, v in data["quant_bits"].items() if k != "source"}  # type: ignore[attr-defined]
        for family in data["family"]:  # type: ignore[attr-defined]
            for quant in family["quants"]:
                bits = float(family.get("bits_per_weight", {}).get(quant) or quant_bits[quant])
                file_bytes = family.get("file_bytes", {}).get(quant) or int(family["params"] * bits / 8)
                entries.append(
                    ModelEntry(
                        key=f"{family['name']}:{quant}".lower(),
                        family=family["name"],
                        params=int(family["params"]),
                        active_params=int(family.get("active_params", family["params"])),
                        quant=quant,
                        bits_per_weight=bits,
                        file_bytes=int(file_bytes),
                        file_bytes_measured=quant in family.get("file_bytes", {}),
                        floor_bytes=int(file_bytes),
                        layers=int(family["layers"]),
                        context_length=int(family["context_length"]),
                        kv_bytes_per_token=family.get("kv_bytes_per_token"),
                        fixed_state_bytes=int(family.get("fixed_state_bytes", 0)),
                        frontier=bool(family.get("frontier", False)),
                        ollama=family.get("ollama", {}).get(quant),
                        gguf_repo=family.get("gguf_repo"),
                        licence=family["licence"],
                        facts_date=family["facts_date"],
                        note=family.get("note", ""),
                        series=family.get("series", family["name"]),
                        architecture=family.get("architecture", ""),
                        source=family.get("source", ""),
                        header_file=_header_file(family["name"], quant),
                        role=_role(family),
                        reasoning_effort=_effort(family),
                    )
                )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"recipes/models.toml: an entry lacks {exc}", hint="fix the entry") from None
    return tuple(entries) + tuple(_frontier_entry(model) for model in load_frontier())


#: The roles a catalog family may have (recipes/models.toml ``role``; default ``chat``).
CATALOG_ROLES = ("chat", "embeddings")


def _role(family: dict[str, object]) -> str:
    role = str(family.get("role", "chat"))
    if role not in CATALOG_ROLES:
        raise CatalogError(f"recipes/models.toml: {family['name']}'s role {role!r} is not one of {', '.join(CATALOG_ROLES)}", hint="fix the entry")
    return role


def _effort(family: dict[str, object]) -> str | None:
    effort = family.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise CatalogError(
            f"recipes/models.toml: {family['name']}'s reasoning_effort {effort!r} is not one of {', '.join(REASONING_EFFORTS)}", hint="fix the entry"
        )
    return None if effort is None else str(effort)


def _header_file(name: str, quant: str) -> str | None:
    """recipes/headers/NAME.QUANT.json's name, if the catalog has that header."""
    file = f"{name}.{quant}.json"
    return file if (recipes_dir() / "headers" / file).is_file() else None


def load_entry_headers(entry: ModelEntry) -> list[GGUFHeader] | None:
    """The GGUF headers a catalog entry's compact header describes (None: it has none).

    Raises:
        CatalogError: the file is unreadable or not a compact header within the parser's limits.
    """
    if entry.header_file is None:
        return None
    return list(_read_compact(entry.header_file))


@cache
def _read_compact(file: str) -> tuple[GGUFHeader, ...]:
    path = recipes_dir() / "headers" / file
    try:
        return tuple(from_compact(json.loads(path.read_text()), f"catalog:{file.removesuffix('.json')}"))
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", hint="reinstall tierlocal or regenerate it (tests/support/catalog_headers.py)") from None


def _frontier_entry(model: FrontierModel) -> ModelEntry:
    precision = next((p for p in load_precisions() if p.name == model.shipped_precision), None)
    if precision is None:
        raise CatalogError(f"recipes/frontier.toml: {model.name}'s precision {model.shipped_precision!r} is not in precisions.toml")
    return ModelEntry(
        key=f"{model.name}:{model.shipped_precision}",
        family=model.name,
        params=model.params,
        active_params=model.active_params,
        quant=model.shipped_precision.upper(),
        bits_per_weight=(precision.bytes_per_weight + precision.block_scale_bytes_per_weight) * 8,
        file_bytes=model.repo_bytes,
        file_bytes_measured=True,
        floor_bytes=weights_bytes(model.params, precision),
        layers=model.layers,
        context_length=model.context_length,
        kv_bytes_per_token=None,
        fixed_state_bytes=0,
        frontier=True,
        ollama=None,
        gguf_repo=None,
        licence=model.licence,
        facts_date=model.facts_date,
        note=model.no_support,
    )


@cache
def load_licences() -> dict[str, LicenceTerms]:
    """What each licence id of models.toml allows, from recipes/licences.toml.

    Raises:
        CatalogError: an entry lacks a field or names a use that is not one of LICENCE_USES.
    """
    terms = {}
    try:
        for licence, entry in _load("licences.toml")["licence"].items():  # type: ignore[attr-defined]
            if entry["use"] not in LICENCE_USES:
                raise CatalogError(
                    f"recipes/licences.toml: {licence}: use {entry['use']!r} is not one of {', '.join(LICENCE_USES)}", hint="fix the entry"
                )
            terms[licence] = LicenceTerms(
                licence, entry["name"], entry["use"], entry["summary"], entry["source"], str(entry["date"]), bool(entry["read"])
            )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"recipes/licences.toml: an entry lacks {exc}", hint="fix the entry") from None
    return terms


@cache
def load_precisions() -> tuple[Precision, ...]:
    """Bytes per weight by precision (recipes/precisions.toml)."""
    try:
        return tuple(
            Precision(p["name"], float(p["bytes_per_weight"]), float(p.get("block_scale_bytes_per_weight", 0.0)))
            for p in _load("precisions.toml")["precision"]  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"recipes/precisions.toml: an entry lacks {exc}", hint="fix the entry") from None


@cache
def load_frontier() -> tuple[FrontierModel, ...]:
    """Every model in recipes/frontier.toml."""
    models = []
    try:
        for m in _load("frontier.toml")["model"]:  # type: ignore[attr-defined]
            attention = m["attention"]
            models.append(
                FrontierModel(
                    name=m["name"],
                    display_name=m["display_name"],
                    facts_date=m["facts_date"],
                    source=m["source"],
                    licence=m["licence"],
                    params=int(m["params"]),
                    active_params=int(m["active_params"]),
                    layers=int(m["layers"]),
                    context_length=int(m["context_length"]),
                    shipped_precision=m["shipped_precision"],
                    repo_bytes=int(m["repo_bytes"]),
                    repo_shards=int(m["repo_shards"]),
                    serving_floor_bytes=int(m["serving_floor_bytes"]),
                    disk_to_plan_bytes=int(m["disk_to_plan_bytes"]),
                    engines=tuple(m["engines"]),
                    no_support=m["no_support"],
                    kv_published=bool(attention["kv_published"]),
                    kv_unknown_reason=attention.get("kv_unknown_reason", ""),
                    attention_layers={k: int(v) for k, v in attention.items() if k.endswith("_layers")},
                    classic_example=dict(attention.get("classic_example", {})),
                    attention_dims={k: int(v) for k, v in attention.get("dims", {}).items() if k != "source"},
                    attention_dims_source=str(attention.get("dims", {}).get("source", "")),
                    published_configs=tuple(
                        PublishedConfig(c["label"], c["gpu"], int(c["count"]), int(c["memory_bytes"])) for c in m.get("published_configs", [])
                    ),
                    guidance=dict(m.get("guidance", {})),
                    vllm_notes=dict(m.get("vllm", {})),
                    launch=dict(m.get("launch", {})),
                    single_machine=dict(m.get("single_machine", {})),
                    experts=int(m["experts"]) if "experts" in m else None,
                    experts_per_token=int(m["experts_per_token"]) if "experts_per_token" in m else None,
                    published_throughput=tuple(dict(row) for row in m.get("published_throughput", [])),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/frontier.toml: an entry lacks {exc}", hint="fix the entry") from None
    return tuple(models)


def catalog_reasoning_effort(source: str) -> str | None:
    """The reasoning effort the catalog model ``source`` names is scored at and served at
    (recipes/models.toml ``reasoning_effort``; gpt-oss: high); None for a file, a URL, an
    hf:// source or a model without effort levels."""
    entries = find_model(source) if "/" not in source and not source.endswith(".gguf") else []
    return entries[0].reasoning_effort if entries else None


def find_frontier(name: str) -> FrontierModel | None:
    """The frontier model called ``name`` (case-insensitive), if recipes has it."""
    return next((m for m in load_frontier() if m.name == name.lower()), None)


@cache
def load_apis() -> tuple[ApiEntry, ...]:
    """Hosted APIs with their dated prices (recipes/apis.toml)."""
    try:
        return tuple(
            ApiEntry(
                name=a["name"],
                model=a["model"],
                base_url=a["base_url"],
                model_id=a["model_id"],
                key_env=a["key_env"],
                prices=ApiPrices(float(a["input_cache_hit"]), float(a["input_cache_miss"]), float(a["output"])),
                prices_date=a["prices_date"],
                source=a["source"],
                speaks=tuple(a["speaks"]),
                speaks_source=a["speaks_source"],
            )
            for a in _load("apis.toml")["api"]  # type: ignore[attr-defined]
        )
    except (KeyError, TypeError) as exc:
        raise CatalogError(f"recipes/apis.toml: an entry lacks {exc}", hint="fix the entry") from None


def find_model(name: str) -> list[ModelEntry]:
    """Entries whose family (``qwen3-14b``) or family:quant (``qwen3-14b:q4_k_m``) is ``name``."""
    wanted = name.lower()
    return [entry for entry in load_models() if wanted in (entry.family.lower(), entry.key)]


@dataclass(frozen=True)
class QualityFacts:
    """recipes/quality.toml: which tasks each benchmark counts for, every published figure, each
    quantisation's measured loss (by upper-case type name), and why a model has no figures."""

    benchmark_tasks: dict[str, tuple[str, ...]]
    figures: tuple[QualityFigure, ...]
    quant_losses: dict[str, QuantLoss]
    no_figures: dict[str, str]
    #: The rules the file states for its figures (:mod:`tierlocal.plan.quality_rules`).
    rules: QualityRules = field(default_factory=QualityRules)


#: The modes a figure is reported in (recipes/quality.toml ``mode``).
QUALITY_MODES = ("thinking", "standard")
#: Reasoning efforts a figure or a model's thinking may be at (gpt-oss's levels).
REASONING_EFFORTS = ("low", "medium", "high")
#: Thinking at a named effort, as a candidate's mode (``thinking-low``).
EFFORT_MODES = tuple(f"thinking-{effort}" for effort in REASONING_EFFORTS)


@cache
def load_answer_lengths() -> AnswerLengths:
    """recipes/answer_tokens.toml: the tokens models spend per question, by mode, as published,
    and the workload a typical answer is priced on.

    Raises:
        CatalogError: an entry lacks a field, names no catalog model, a mode that is not one, or
            a count that is not positive (or reasoning tokens beyond the whole); no measurement
            is on the reference workload.
    """
    families = {entry.family for entry in load_models()}
    found = []
    data = _load("answer_tokens.toml")
    try:
        reference: dict[str, object] = data["reference"]  # type: ignore[assignment]
        for row in data["length"]:  # type: ignore[attr-defined]
            reasoning = row.get("reasoning_tokens")
            length = AnswerLength(
                str(row["model"]),
                str(row["mode"]),
                float(row["tokens_per_answer"]),
                None if reasoning is None else float(reasoning),
                str(row["workload"]),
                str(row["source"]),
                str(row["date"]),
            )
            if length.model not in families or length.mode not in (*QUALITY_MODES, *EFFORT_MODES) or not 0 < length.tokens_per_answer < 1e9:
                raise CatalogError(
                    f"recipes/answer_tokens.toml: {length.model} ({length.mode}): not a catalog model, mode or count", hint="fix the entry"
                )
            if length.reasoning_tokens is not None and not 0 <= length.reasoning_tokens <= length.tokens_per_answer:
                raise CatalogError(f"recipes/answer_tokens.toml: {length.model}: reasoning tokens beyond the whole", hint="fix the entry")
            found.append(length)
        answer: dict[str, object] = data["answer"]  # type: ignore[assignment]
        answer_tokens = float(answer["tokens"])  # type: ignore[arg-type]
        lengths = AnswerLengths(str(reference["workload"]), str(reference["why"]), tuple(found), answer_tokens, str(answer["source"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/answer_tokens.toml: an entry lacks or mistypes {exc}", hint="fix the entry") from None
    if not any(length.workload == lengths.reference_workload for length in found):
        raise CatalogError("recipes/answer_tokens.toml: no measurement on the reference workload", hint="fix [reference] workload")
    return lengths


@cache
def load_quality() -> QualityFacts:
    """recipes/quality.toml, checked: every figure names a catalog model, a listed benchmark, a
    mode of :data:`QUALITY_MODES` and a score from 0 to 100.

    Raises:
        CatalogError: the file is missing, or an entry is malformed.
    """
    data = _load("quality.toml")
    families = {entry.family for entry in load_models()}
    try:
        tasks = {str(b["name"]): tuple(str(task) for task in b["tasks"]) for b in data["benchmark"]}  # type: ignore[attr-defined]
        rules = _quality_rules(data)
        figures = tuple(
            QualityFigure(
                str(f["model"]),
                str(f["benchmark"]),
                str(f["mode"]),
                float(f["score"]),
                str(f["setting"]),
                bool(f["self_reported"]),
                str(f["source"]),
                str(f["date"]),
                None if f.get("effort") is None else str(f["effort"]),
                not bool(f["self_reported"]) and not str(f["source"]).startswith(rules.publisher_pages),
            )
            for f in data["figure"]  # type: ignore[attr-defined]
        )
        losses = {
            str(q["quant"]).upper(): QuantLoss(
                str(q["quant"]), float(q["ppl_increase"]), q.get("mean_kld"), str(q["measured_on"]), str(q["source"]), str(q["date"])
            )
            for q in data.get("quant_loss", [])  # type: ignore[attr-defined]
        }
        no_figures = {str(m["model"]): str(m["why"]) for m in data.get("no_figures", [])}  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"recipes/quality.toml: an entry lacks or mistypes {exc}", hint="fix the entry") from None
    for figure in figures:
        problem = _figure_problem(figure, families, tasks)
        if problem:
            raise CatalogError(f"recipes/quality.toml: {figure.model} {figure.benchmark} has {problem}", hint="fix the entry")
    return QualityFacts(tasks, figures, losses, no_figures, rules)


def _quality_rules(data: dict[str, object]) -> QualityRules:
    """``[[mode_rule]]``, ``[[mode_words]]``, ``[[version_rule]]`` (patterns compiled once here) and
    ``[[publisher_pages]]``.

    Raises:
        CatalogError: a mode that is not one, or a pattern that does not compile.
    """
    modes = tuple(
        ModeRule(tuple(map(str, r["models"])), tuple(map(str, r["modes"])), str(r["why"]), tuple(map(str, r.get("sources", []))))
        for r in data.get("mode_rule", [])  # type: ignore[attr-defined]
    )
    words = tuple(ModeWords(str(w["mode"]), tuple(str(word).lower() for word in w["words"])) for w in data.get("mode_words", []))  # type: ignore[attr-defined]
    versions = tuple(VersionRule(str(v["family"]), str(v["benchmark"]), str(v["pattern"])) for v in data.get("version_rule", []))  # type: ignore[attr-defined]
    for mode in {m for rule in modes for m in rule.modes} | {w.mode for w in words}:
        if mode not in (*QUALITY_MODES, "unstated"):
            raise CatalogError(f"recipes/quality.toml: a rule names the mode {mode!r}", hint=f"use {' or '.join(QUALITY_MODES)}")
    for version in versions:
        try:
            re.compile(version.pattern)
        except re.error as exc:
            raise CatalogError(f"recipes/quality.toml: {version.benchmark}'s pattern does not compile: {exc}", hint="fix the pattern") from None
    pages = tuple(str(prefix) for entry in data.get("publisher_pages", []) for prefix in entry["prefixes"])  # type: ignore[attr-defined]
    return QualityRules(modes, words, versions, pages)


def _figure_problem(figure: QualityFigure, families: set[str], tasks: dict[str, tuple[str, ...]]) -> str:
    """What is wrong with a figure, or ""."""
    if figure.model not in families:
        return "an unknown model"
    if figure.benchmark not in tasks:
        return "an unlisted benchmark"
    if figure.mode not in QUALITY_MODES:
        return f"a mode other than {' or '.join(QUALITY_MODES)}"
    if not 0.0 <= figure.score <= 100.0:
        return "a score outside 0-100"
    if figure.effort is not None and (figure.effort not in REASONING_EFFORTS or figure.mode != "thinking"):
        return f"an effort other than {' or '.join(REASONING_EFFORTS)} of thinking"
    return ""
