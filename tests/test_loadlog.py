"""The load-log parser on real logs captured from the built engines
(tests/support/capture_loadlogs.py says how each was provoked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlocal.engines.loadlog import LoadLogParser, is_host_buffer, parse_load_log

LOGS = Path(__file__).resolve().parent / "fixtures" / "loadlogs"
MIB = 1024 * 1024


def _report(name: str):  # type: ignore[no-untyped-def]
    return parse_load_log((LOGS / f"{name}.log").read_text())


def test_partial_offload_on_vulkan() -> None:
    report = _report("vulkan-gemma-partial")  # -c 8192 -np 2 -ngl 10
    assert (report.layers_offloaded, report.layers_total) == (10, 19)
    assert (report.n_ctx, report.n_seq_max, report.n_slots, report.n_ctx_slot, report.kv_unified) == (8192, 2, 2, 4096, False)
    assert report.devices == {"Vulkan0": 2048 * MIB}
    assert report.ready and report.failures == []
    # Each device's buffers add up to the "self" column of llama.cpp's own breakdown table
    # (a second, independent line format in the same log; integer MiB, truncated).
    vulkan = report.buffers["Vulkan0"]
    assert vulkan.weights and vulkan.kv and vulkan.compute
    assert int(vulkan.total / MIB) == report.breakdown_self_mib["Vulkan0"]
    host = report.host_bytes()
    assert abs(host.weights + host.kv + host.compute - report.breakdown_self_mib["Host"] * MIB) < MIB
    # KV on both sides of the split: 9 layers of 18 on the device (the output layer is the 10th).
    assert report.buffers["CPU"].kv > 0


def test_unified_kv_with_automatic_slots() -> None:
    report = _report("vulkan-gemma-full-unified")  # -c 8192, no -np: llama-server's 4 unified slots
    assert (report.layers_offloaded, report.layers_total) == (19, 19)
    assert (report.n_slots, report.n_ctx_slot, report.kv_unified) == (4, 8192, True)
    assert "CPU" not in report.buffers or report.buffers["CPU"].kv == 0


def test_quantised_cache_and_flash_attention_reported() -> None:
    report = _report("vulkan-qwen3-8b-partial-q8")  # -ngl 7 -ctk/-ctv q8_0 -fa on
    assert (report.layers_offloaded, report.layers_total) == (7, 37)
    assert report.flash_attn == "enabled"
    assert int(report.buffers["Vulkan0"].total / MIB) == report.breakdown_self_mib["Vulkan0"]


def test_cpu_build_has_no_offload_line_and_counts_recurrent_state() -> None:
    report = _report("cpu-lfm2-recurrent")  # LFM2: KV for attention layers, RS for the conv layers
    assert report.layers_offloaded is None
    assert report.buffers["CPU"].recurrent > 0 and report.buffers["CPU"].kv > 0
    assert (report.n_slots, report.n_ctx_slot) == (2, 4096)
    assert report.fit_projections[0].startswith("projected to use ")


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("fail-unknown-arch", ["unknown_architecture", "model_error", "load_failed"]),
        ("fail-vcache-needs-fa", ["vcache_needs_flash_attn", "load_failed"]),
        ("fail-alloc-cpu", ["alloc_failed", "load_failed"]),
        ("crash-vulkan-kv-too-large", ["crashed"]),
        ("ctx-exceeded", ["context_exceeded"]),
        ("fail-chat-template", ["chat_template", "load_failed"]),
    ],
)
def test_known_failures(name: str, kinds: list[str]) -> None:
    report = _report(name)
    assert [failure.kind for failure in report.failures] == kinds
    assert report.ready is (name == "ctx-exceeded")  # that one fails a request, not the load


def test_failure_details() -> None:
    assert "'nosucharch'" in _report("fail-unknown-arch").failures[0].line
    alloc = _report("fail-alloc-cpu").failure("alloc_failed")
    assert alloc is not None and "CPU buffer of size 1228800000000" in alloc.line


def test_incremental_feed_equals_whole_parse() -> None:
    text = (LOGS / "vulkan-gemma-partial.log").read_text()
    parser = LoadLogParser()
    for line in text.splitlines(keepends=True):
        parser.feed(line)
    assert parser.report() == parse_load_log(text)


def test_lines_without_prefix_and_hostile_lengths() -> None:
    parser = LoadLogParser()
    parser.feed("load_tensors: offloaded 3/29 layers to GPU")  # --no-log-prefix, as Ollama runs it
    parser.feed("x" * 10_000_000 + "offloaded 9/9 layers to GPU")  # cut to 4096 chars: not matched
    parser.feed("llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB")
    report = parser.report()
    assert (report.layers_offloaded, report.layers_total) == (3, 29)
    assert report.buffers["CUDA0"].kv == 512 * MIB


@pytest.mark.parametrize(
    ("name", "host"),
    [
        ("CPU", True),
        ("CPU_Mapped", True),
        ("CPU_REPACK", True),
        ("Vulkan_Host", True),
        ("CUDA_Host", True),
        ("Vulkan0", False),
        ("CUDA0", False),
        ("ROCm0", False),
    ],
)
def test_host_buffer_names(name: str, host: bool) -> None:
    assert is_host_buffer(name) is host


def test_projector_buffers_counted_on_their_devices() -> None:
    """A Gemma 3 SigLIP projector on Mesa's Vulkan device without flash attention: its weights
    and part of its compute there, the attention scores the device cannot bind on the CPU."""
    report = parse_load_log((LOGS / "vulkan-gemma-mmproj-scores-on-cpu.log").read_text())
    assert report.projector_backend == "Vulkan0"
    assert report.projector_weights == round(807.57 * MIB)
    assert report.projector_compute == {"Vulkan0": round(104.66 * MIB), "CPU": round(1078.00 * MIB)}
    assert report.buffers["Vulkan0"].projector == round(807.57 * MIB) + round(104.66 * MIB)
    assert report.host_bytes().projector == round(1078.00 * MIB)
    assert report.to_json()["projector"] == {"backend": "Vulkan0", "weights_bytes": round(807.57 * MIB), "compute_bytes": report.projector_compute}


def test_a_later_projector_reservation_replaces_the_first() -> None:
    """clip reserves twice when flash attention turns out unsupported: the second one stands."""
    lines = [
        "clip_ctx: CLIP using CPU backend",
        "load_hparams: model size:         124.89 MiB",
        "reserve_compute_meta:        CPU compute buffer size =    30.31 MiB",
        "reserve_compute_meta:        CPU compute buffer size =    91.00 MiB",
    ]
    report = parse_load_log("\n".join(lines))
    assert report.projector_compute == {"CPU": round(91.00 * MIB)}
    assert report.buffers["CPU"].projector == round(124.89 * MIB) + round(91.00 * MIB)
