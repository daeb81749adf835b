"""llama-server's load log as data: what it offloaded, the buffers it allocated per device,
the context it made, and the known ways a load fails.

Pure: feed it lines (with or without llama.cpp's ``0.00.123.456 I`` prefix) as they arrive;
``report()`` gives the LoadReport so far. Buffer lines need ``-lv 4`` on llama.cpp builds from
May 2026 on. Sizes are printed in MiB with two decimals; they are kept in bytes (rounded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["BufferSizes", "LoadFailure", "LoadReport", "LoadLogParser", "parse_load_log", "is_host_buffer"]

_MIB = 1024 * 1024
#: Longest line kept (characters); longer lines are cut before matching.
MAX_LINE_CHARS = 4096
#: Most failure lines kept.
MAX_FAILURES = 20

_OFFLOADED = re.compile(r"offloaded\s+(\d+)/(\d+)\s+layers to GPU")
_BUFFERS = {
    "weights": re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
    "recurrent": re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s+([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB"),
}
#: The multimodal projector (clip): its backend, its weights ("model size", every tensor) and
#: the compute buffers its warm-up reserved (a second reservation replaces the first).
_CLIP_BACKEND = re.compile(r"clip_ctx: CLIP using (\S+) backend")
_CLIP_WEIGHTS = re.compile(r"load_hparams: model size:\s+([\d.]+) MiB")
_CLIP_COMPUTE = re.compile(r"(?:reserve_compute_meta|alloc_compute_meta):\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_CONTEXT = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max|n_batch|n_ubatch)\s+= (\d+)")
_FLASH = re.compile(r"llama_context: flash_attn\s+= (\S+)")
_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'")
_BUILD = re.compile(r"build (\d+) \(([0-9a-f]+|unknown)\)")
_DEVICE = re.compile(r"using device (\S+) \((.*)\) .*- (\d+) MiB free")
_PROJECTED = re.compile(r"common_params_fit_impl: (projected to use .*|will leave .*)$")
_BREAKDOWN = re.compile(r"common_memory_breakdown_print: \|\s+- (\S+)(?: \(.*?\))?\s+\|.*?(\d+) =\s+(\d+) \+\s+(\d+) \+\s+(\d+)")
_READY = re.compile(r"server is listening on|main: model loaded|llama_server: model loaded")
_FAILURES = [
    ("unknown_architecture", re.compile(r"unknown model architecture: '([^']*)'")),
    ("alloc_failed", re.compile(r"failed to allocate (\S+) buffer of size (\d+)")),
    ("vcache_needs_flash_attn", re.compile(r"V cache quantization requires flash_attn|quantized V cache requires flash_attn")),
    ("context_exceeded", re.compile(r"Context size has been exceeded|exceeds the available context size")),
    ("crashed", re.compile(r"GGML_ASSERT|GGML_ABORT|pre-allocated tensor .* cannot run|Segmentation fault|terminate called")),
    ("model_error", re.compile(r"error loading model: ")),
    ("load_failed", re.compile(r"exiting due to model loading error|failed to load model")),
    ("port_in_use", re.compile(r"couldn't bind HTTP server socket")),
    ("chat_template", re.compile(r"common_chat_templates_init: error: |chat template parsing error|failed to apply template")),
]


def is_host_buffer(name: str) -> bool:
    """Whether a llama.cpp buffer name lives in system RAM (CPU, CPU_Mapped, CPU_REPACK,
    Vulkan_Host, CUDA_Host …) rather than on an accelerator."""
    return name.startswith("CPU") or name.endswith("_Host") or name == "Host"


@dataclass
class BufferSizes:
    """Bytes llama.cpp allocated in one buffer type, by what they hold."""

    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    output: int = 0
    #: A multimodal projector's weights and compute buffer.
    projector: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.output + self.projector


@dataclass(frozen=True)
class LoadFailure:
    """A known failure: ``kind`` (unknown_architecture, alloc_failed, vcache_needs_flash_attn,
    context_exceeded, crashed, model_error, load_failed, port_in_use, chat_template) and the line that said so."""

    kind: str
    line: str


@dataclass
class LoadReport:
    """What one llama-server load reported. ``buffers`` maps llama.cpp's buffer names
    (Vulkan0, CUDA0, CPU_Mapped, Vulkan_Host …) to sizes in bytes."""

    build: str | None = None
    devices: dict[str, int] = field(default_factory=dict)
    layers_offloaded: int | None = None
    layers_total: int | None = None
    buffers: dict[str, BufferSizes] = field(default_factory=dict)
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_seq_max: int | None = None
    n_ubatch: int | None = None
    flash_attn: str | None = None
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None
    fit_projections: list[str] = field(default_factory=list)
    breakdown_self_mib: dict[str, int] = field(default_factory=dict)
    failures: list[LoadFailure] = field(default_factory=list)
    ready: bool = False
    #: The projector's backend (``CPU``, ``Vulkan0`` …), weights and compute per buffer (bytes).
    projector_backend: str | None = None
    projector_weights: int = 0
    projector_compute: dict[str, int] = field(default_factory=dict)

    def gpu_buffers(self) -> dict[str, BufferSizes]:
        """The accelerator buffers (everything not in system RAM)."""
        return {name: sizes for name, sizes in self.buffers.items() if not is_host_buffer(name)}

    def host_bytes(self) -> BufferSizes:
        """Every system-RAM buffer added up."""
        total = BufferSizes()
        for name, sizes in self.buffers.items():
            if is_host_buffer(name):
                for part in ("weights", "kv", "recurrent", "compute", "output", "projector"):
                    setattr(total, part, getattr(total, part) + getattr(sizes, part))
        return total

    def failure(self, kind: str) -> LoadFailure | None:
        return next((failure for failure in self.failures if failure.kind == kind), None)

    def to_json(self) -> dict[str, object]:
        """The documented ``actual`` object of ``serve --json`` and ``status``: what llama.cpp
        reported, its buffers summed per device (every system-RAM buffer as ``host``), bytes."""
        devices: dict[str, dict[str, int]] = {}
        for name, sizes in self.buffers.items():
            key = "host" if is_host_buffer(name) else name
            device = devices.setdefault(key, {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "output_bytes": 0, "projector_bytes": 0})
            device["weights_bytes"] += sizes.weights
            device["kv_bytes"] += sizes.kv + sizes.recurrent
            device["compute_bytes"] += sizes.compute
            device["output_bytes"] += sizes.output
            device["projector_bytes"] += sizes.projector
        projector = None
        if self.projector_backend is not None:
            projector = {"backend": self.projector_backend, "weights_bytes": self.projector_weights, "compute_bytes": dict(self.projector_compute)}
        return {
            "layers_offloaded": self.layers_offloaded or 0,
            "layers_total": self.layers_total,
            "devices": [{"name": name, **sizes} for name, sizes in devices.items()],
            "n_ctx": self.n_ctx,
            "n_ctx_per_slot": self.n_ctx_slot,
            "parallel": self.n_slots,
            "kv_unified": self.kv_unified,
            "engine_build": self.build,
            "projector": projector,
        }


class LoadLogParser:
    """Incremental: ``feed`` each line as the engine prints it."""

    def __init__(self) -> None:
        self._report = LoadReport()

    def feed(self, line: str) -> None:
        line = line[:MAX_LINE_CHARS].rstrip("\r\n")
        report = self._report
        if report.build is None and (match := _BUILD.search(line)):
            report.build = f"b{match.group(1)}-{match.group(2)}"
        if match := _DEVICE.search(line):
            report.devices[match.group(1)] = int(match.group(3)) * _MIB
        if match := _OFFLOADED.search(line):
            report.layers_offloaded, report.layers_total = int(match.group(1)), int(match.group(2))
        for part, pattern in _BUFFERS.items():
            if match := pattern.search(line):
                sizes = report.buffers.setdefault(match.group(1), BufferSizes())
                setattr(sizes, part, getattr(sizes, part) + round(float(match.group(2)) * _MIB))
        self._feed_projector(line)
        if match := _CONTEXT.search(line):
            setattr(report, match.group(1), int(match.group(2)))
        if match := _FLASH.search(line):
            report.flash_attn = match.group(1)
        if match := _SLOTS.search(line):
            report.n_slots, report.n_ctx_slot, report.kv_unified = int(match.group(1)), int(match.group(2)), match.group(3) == "true"
        if match := _PROJECTED.search(line):
            report.fit_projections.append(match.group(1))
        if match := _BREAKDOWN.search(line):
            # "self = model + context + compute" (the first number group that has that shape)
            report.breakdown_self_mib[match.group(1)] = int(match.group(2))
        if _READY.search(line):
            report.ready = True
        if len(report.failures) < MAX_FAILURES:
            for kind, pattern in _FAILURES:
                if pattern.search(line) and not any(f.kind == kind for f in report.failures):
                    report.failures.append(LoadFailure(kind, line.strip()))

    def _feed_projector(self, line: str) -> None:
        report = self._report
        if match := _CLIP_BACKEND.search(line):
            report.projector_backend = match.group(1)
        elif (match := _CLIP_WEIGHTS.search(line)) and report.projector_backend is not None:
            report.projector_weights = round(float(match.group(1)) * _MIB)
            report.buffers.setdefault(report.projector_backend, BufferSizes()).projector += report.projector_weights
        elif (match := _CLIP_COMPUTE.search(line)) and report.projector_backend is not None:
            name, size = match.group(1), round(float(match.group(2)) * _MIB)
            sizes = report.buffers.setdefault(name, BufferSizes())
            sizes.projector += size - report.projector_compute.get(name, 0)  # a later reservation replaces an earlier one
            report.projector_compute[name] = size

    def report(self) -> LoadReport:
        return self._report


def parse_load_log(text: str) -> LoadReport:
    """Parse a whole log at once."""
    parser = LoadLogParser()
    for line in text.splitlines():
        parser.feed(line)
    return parser.report()
