"""Speed of a planned run: decode tokens/s, prefill tokens/s and time to first token, from the
tensors each device holds and that device's effective figures. Pure.

The model is linear in a few *features* of a run, each priced by the device that does the work
(:class:`DeviceSpeed`, seconds per unit):

- Decode, per generated token: the bytes of every weight matrix the token multiplies, by
  quantisation type (``bytes:Q4_K`` …; expert tensors count their used share; the token
  embedding one row, i.e. nothing; a tied output reads the embedding matrix), priced at that
  type's mat-vec rate on its device — memory- or dequantisation-bound, whichever the device
  showed; the KV cache read at the current depth (at the F16 rate); and fixed costs — per
  token, per layer on the device, and per vocabulary entry (logits and sampling, on the host).
- Prefill, per prompt token: 2 FLOPs per weight a token multiplies (experts: the used share),
  by type (``flops:Q4_K``); attention, 2 × heads × (K + V head size) FLOPs per key attended;
  per-layer and per-token fixed costs. The output layer runs once per prompt (llama-server
  keeps the last token's logits only).
- Time to first token = prefill of the prompt + one decode step.

A CPU's figures come from ``tierlocal hw --calibrate`` (the engine timed on probe models,
:func:`fit_device_speed`); a GPU's from the model fitted to published llama-bench results
(:mod:`tierlocal.fit.gpu_speed`); a device with neither, from its memory bandwidth alone (the bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from .device_speed import DeviceSpeed
from .estimate import Machine, RunEstimate
from .features import DEFAULT_DEPTH, PREFILL_PROMPT, Features, RunFeatures, add_feature, run_features
from .model import ModelSpec

__all__ = [
    "RunFeatures",
    "SpeedEstimate",
    "DecodeSpeed",
    "decode_speed",
    "run_features",
    "estimate_speed",
    "add_feature",
    "Features",
    "DEFAULT_DEPTH",
    "TTFT_PROMPTS",
    "bound_speed",
    "speed_basis",
    "BASES",
    "decode_seconds",
    "prefill_seconds",
    "priced_seconds",
]

#: Prompt lengths time to first token is quoted for (those that fit a slot).
TTFT_PROMPTS = (128, 512, 2048)


def priced_seconds(features: Features, table: Mapping[str, float], unit: str, speed: DeviceSpeed, uncalibrated: set[str]) -> float:
    """Seconds for the ``{unit}:TYPE`` and ``x{unit}:TYPE`` (expert) features at ``table``'s rates."""
    seconds = 0.0
    for name, amount in features.items():
        kind, _, ggml_type = name.partition(":")
        if kind not in (unit, f"x{unit}"):
            continue
        rate, exact = speed.rate(table, ggml_type)
        if kind != unit:
            rate *= speed.expert_factor(table, ggml_type)
        if not exact:
            uncalibrated.add(ggml_type)
        seconds += amount / rate
    return seconds


def decode_seconds(features: Features, speed: DeviceSpeed, uncalibrated: set[str]) -> float:
    """Seconds of one generated token's ``features`` on the device ``speed`` describes (types
    priced at a neighbour's rate are added to ``uncalibrated``)."""
    seconds = priced_seconds(features, speed.decode_bytes_per_s, "bytes", speed, uncalibrated)
    seconds += features.get("kv_bytes", 0.0) / speed.rate(speed.decode_bytes_per_s, "F16")[0]
    seconds += features.get("token", 0.0) * speed.token_overhead_s
    seconds += features.get("layer", 0.0) * speed.layer_overhead_s
    seconds += features.get("vocab", 0.0) * speed.vocab_overhead_s
    seconds += sum(amount * speed.row_seconds(name[5:]) for name, amount in features.items() if name.startswith("rows:"))
    return seconds


def prefill_seconds(features: Features, speed: DeviceSpeed, uncalibrated: set[str]) -> float:
    """Seconds of one prompt token's ``features`` (or a prompt's ``once`` features) on the device.
    An MoE's expert mat-muls also stream the weights of the experts each batch touches
    (``xread:TYPE``, bytes per prompt token) ``expert_batch_reads`` times at the decode byte rate."""
    seconds = priced_seconds(features, speed.prefill_flops_per_s, "flops", speed, uncalibrated)
    if speed.expert_batch_reads > 0:
        reads = {f"bytes:{name[6:]}": amount for name, amount in features.items() if name.startswith("xread:")}
        seconds += speed.expert_batch_reads * priced_seconds(reads, speed.decode_bytes_per_s, "bytes", speed, set())
    seconds += features.get("elems", 0.0) * speed.prefill_element_s
    if features.get("attn_flops"):
        seconds += features["attn_flops"] / speed.attention_flops_per_s
    seconds += features.get("token", 0.0) * speed.prefill_token_overhead_s
    seconds += features.get("layer", 0.0) * speed.prefill_layer_overhead_s
    return seconds


@dataclass(frozen=True)
class SpeedEstimate:
    """Decode and prefill of one planned run. Tokens/s; seconds. ``decode_s`` splits one
    decode step by device; ``first_token_s`` maps prompt tokens to time to first token;
    ``sources`` says where each device's figures came from; ``uncalibrated_types`` lists
    weight types priced at a neighbour's rate."""

    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    first_token_s: tuple[tuple[int, float], ...]
    decode_s: dict[str, float]
    depth: int
    sources: dict[str, str]
    uncalibrated_types: tuple[str, ...] = ()
    reason: str | None = None
    #: What the decode figure rests on (:data:`BASES`): the basis of the device that spends the
    #: most of a decode step.
    basis: str = "bound"

    def to_json(self) -> dict[str, object]:
        return {
            "basis": self.basis,
            "decode_tokens_per_s": None if self.decode_tokens_per_s is None else round(self.decode_tokens_per_s, 1),
            "prefill_tokens_per_s": None if self.prefill_tokens_per_s is None else round(self.prefill_tokens_per_s, 1),
            "first_token_s": {str(prompt): round(seconds, 3) for prompt, seconds in self.first_token_s},
            "decode_s_per_token": {device: round(seconds, 5) for device, seconds in self.decode_s.items()},
            "depth": self.depth,
            "sources": self.sources,
            "uncalibrated_types": list(self.uncalibrated_types),
            "reason": self.reason,
        }


def _decode_step(run: RunFeatures, devices: Mapping[str, DeviceSpeed | None], uncalibrated: set[str]) -> dict[str, float]:
    """Seconds of one decode step on each device that has work."""
    return {name: decode_seconds(f, speed, uncalibrated) for name, f in run.decode.items() if f and (speed := devices[name]) is not None}


def _prefill_time(run: RunFeatures, devices: Mapping[str, DeviceSpeed | None], uncalibrated: set[str]) -> float:
    """Seconds to process ``run.prompt`` prompt tokens, every device's share in turn."""
    total = 0.0
    for name, speed in devices.items():
        if speed is not None:
            total += prefill_seconds(run.prefill[name], speed, uncalibrated) * run.prompt + prefill_seconds(run.once[name], speed, uncalibrated)
    return total


#: What a speed rests on, best first: ``measured`` (`tierlocal bench` on this machine),
#: ``calibrated`` (this CPU timed by `tierlocal hw --calibrate`), ``published`` (llama-bench
#: results for this GPU), ``derived`` (its generation's or backend's results on its datasheet),
#: ``bound`` (memory bandwidth alone: a ceiling, not an estimate).
BASES = ("measured", "calibrated", "published", "derived", "bound")


def speed_basis(speed: DeviceSpeed) -> str:
    """A device's figures as one of :data:`BASES` (a calibration is stored as ``measured``)."""
    if speed.source == "measured":
        return "calibrated"
    return speed.source if speed.source in BASES else "bound"


def bound_speed(device: str, bandwidth_bytes_per_s: int, note: str) -> DeviceSpeed:
    """A device known by its memory bandwidth only: every byte at that rate, no fixed costs and
    no prefill figure (``bound``)."""
    return DeviceSpeed(
        device=device,
        source="bound",
        note=note,
        decode_bytes_per_s={"*": float(bandwidth_bytes_per_s)},
        prefill_flops_per_s={},
        attention_flops_per_s=0.0,
    )


def _unpriced_prefill(run: RunFeatures, devices: Mapping[str, DeviceSpeed | None]) -> DeviceSpeed | None:
    """The first device with prompt work and no prefill figure."""
    for name, speed in devices.items():
        work = {**run.prefill.get(name, {}), **run.once.get(name, {})}
        if speed is not None and not speed.prefill_flops_per_s and any(key.partition(":")[0] in ("flops", "xflops", "attn_flops") for key in work):
            return speed
    return None


def estimate_speed(
    spec: ModelSpec,
    estimate: RunEstimate,
    host: DeviceSpeed,
    gpu: DeviceSpeed | None = None,
    *,
    max_tensor_bytes: int | None = None,
    depth: int = DEFAULT_DEPTH,
    prompts: Sequence[int] = TTFT_PROMPTS,
    prefill_prompt: int = PREFILL_PROMPT,
) -> SpeedEstimate:
    """Decode tokens/s at ``depth`` tokens of context, prefill tokens/s for a prompt of
    ``prefill_prompt`` tokens, and time to first token for each of ``prompts`` that fits a slot."""
    request = estimate.request
    ngl, n_cpu_moe = request.ngl or 0, request.n_cpu_moe or 0
    sources = {"host": f"{host.source}: {host.note}"}
    if estimate.layers_offloaded:
        if gpu is None:
            return SpeedEstimate(
                None, None, (), {}, depth, sources, reason="no speed figures for this GPU (name it with --gpu, or see recipes/gpu_speed.toml)"
            )
        sources["gpu"] = f"{gpu.source}: {gpu.note}"
    devices: dict[str, DeviceSpeed | None] = {"host": host, "gpu": gpu}
    uncalibrated: set[str] = set()

    features = partial(
        run_features,
        spec,
        ngl=ngl,
        n_cpu_moe=n_cpu_moe,
        max_tensor_bytes=max_tensor_bytes,
        cache_type_k=request.cache_type_k,
        cache_type_v=request.cache_type_v,
        ubatch=request.n_ubatch,
    )
    at_depth = features(prompt=prefill_prompt, depth=depth)
    step = _decode_step(at_depth, devices, uncalibrated)
    decode_seconds = sum(step.values())
    busiest = max(step, key=lambda name: step[name]) if step else "host"
    basis = speed_basis(devices[busiest] or host)
    unpriced = _unpriced_prefill(at_depth, devices)
    if unpriced is not None:
        how = "not calibrated" if unpriced is host else "none published for it or its generation"
        reason = f"prefill and first token not estimated: no prefill figure for the {unpriced.device} ({how})"
        return SpeedEstimate(1 / decode_seconds, None, (), step, depth, sources, tuple(sorted(uncalibrated)), reason, basis)
    prefill_seconds = _prefill_time(at_depth, devices, uncalibrated)
    fitting = [prompt for prompt in prompts if prompt + 1 <= estimate.params.n_ctx_seq]
    ttft = [(prompt, _first_token_s(features(prompt=prompt, depth=prompt), devices, uncalibrated)) for prompt in fitting]
    return SpeedEstimate(
        decode_tokens_per_s=1 / decode_seconds if decode_seconds > 0 else None,
        prefill_tokens_per_s=prefill_prompt / prefill_seconds if prefill_seconds > 0 else None,
        first_token_s=tuple(ttft),
        decode_s=step,
        depth=depth,
        sources=sources,
        uncalibrated_types=tuple(sorted(uncalibrated)),
        basis=basis,
    )


def _first_token_s(run: RunFeatures, devices: Mapping[str, DeviceSpeed | None], uncalibrated: set[str]) -> float:
    """Seconds to the first token of ``run``'s prompt: its prefill, then one decode step."""
    return _prefill_time(run, devices, uncalibrated) + sum(_decode_step(run, devices, uncalibrated).values())


# -- the bandwidth-only figure (what check showed before calibration) ---------------------------


@dataclass(frozen=True)
class DecodeSpeed:
    """Bytes read per generated token on each side, the bandwidths they are read at (bytes/s;
    the host's is an assumption), and tokens/s if every layer were on the GPU."""

    gpu_read_bytes_per_token: int
    host_read_bytes_per_token: int
    gpu_bandwidth_bytes_per_s: int | None
    host_bandwidth_bytes_per_s: int
    host_bandwidth_assumed: bool
    all_on_gpu_tokens_per_s: float | None
    estimate: SpeedEstimate | None = field(default=None)

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_read_bytes_per_token": self.gpu_read_bytes_per_token,
            "host_read_bytes_per_token": self.host_read_bytes_per_token,
            "gpu_bandwidth_bytes_per_s": self.gpu_bandwidth_bytes_per_s,
            "host_bandwidth_bytes_per_s": self.host_bandwidth_bytes_per_s,
            "host_bandwidth_assumed": self.host_bandwidth_assumed,
            "all_on_gpu_tokens_per_s": self.all_on_gpu_tokens_per_s,
            "estimate": self.estimate.to_json() if self.estimate else None,
        }


def decode_speed(estimate: RunEstimate, machine: Machine, calibrated: SpeedEstimate | None = None) -> DecodeSpeed:
    """Decode speed by memory bandwidth, the GPU part and the part spilled to RAM apart, with
    the estimate from the devices' figures beside it when there is one."""
    gpu_read, host_read = estimate.gpu_read_bytes_per_token, estimate.host_read_bytes_per_token
    all_on_gpu = None
    if machine.gpu_bandwidth and machine.gpu_name is not None:
        all_on_gpu = round(machine.gpu_bandwidth / max(gpu_read + host_read, 1), 1)
    return DecodeSpeed(gpu_read, host_read, machine.gpu_bandwidth, machine.host_bandwidth, True, all_on_gpu, calibrated)
