"""Multimodal projectors (``--mmproj``): the encoder read from the mmproj header, its weights and
compute buffer on the device llama-server puts it on — checked against real loads of a sparse
Gemma 3 SigLIP projector beside the real Gemma 3 270M, on the CPU and on Mesa's Vulkan device."""

from __future__ import annotations

import json
import math
import re
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.engines import LLVMPIPE_MAX_TENSOR_BYTES, free_port, llama_server_argv, running
from tests.support.serving import serving
from tests.support.sparse_models import RWKV7_168M, write_sparse_gguf
from tests.support.sparse_projectors import GEMMA3_SIGLIP_TO_270M, SparseProjector, projector_tensors, write_sparse_projector
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.projector import projector_spec, projector_usage

_MIB = 1024 * 1024
_CLIP_COMPUTE = re.compile(r"reserve_compute_meta:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_CLIP_WEIGHTS = re.compile(r"load_hparams: model size:\s+([\d.]+) MiB")
#: A smaller image and a shallower tower: 1,024 patches, and scores that fit the device.
SMALL = replace(GEMMA3_SIGLIP_TO_270M, name="gemma-3-siglip-448-4l", image_size=448, n_layer=4)
#: The full image on a shallower tower: weights that leave room on the 2 GiB software device.
SHALLOW = replace(GEMMA3_SIGLIP_TO_270M, name="gemma-3-siglip-896-4l", n_layer=4)


def _written(tmp_path: Path, spec: SparseProjector) -> Path:
    return write_sparse_projector(tmp_path / f"{spec.name}.gguf", spec)


def _compute_by_buffer(log: str) -> dict[str, float]:
    """The projector's compute buffers (MiB) as the last reservation left them."""
    return {name: float(mib) for name, mib in _CLIP_COMPUTE.findall(log)}


def test_projector_header_gives_the_encoder_and_its_bytes(tmp_path: Path) -> None:
    spec = projector_spec(read_headers(str(_written(tmp_path, GEMMA3_SIGLIP_TO_270M))))
    assert (spec.projector_type, spec.n_layer, spec.n_embd, spec.n_ff, spec.n_head) == ("gemma3", 27, 1152, 4304, 16)
    assert spec.n_patches == (896 // 14) ** 2 == 4096
    assert spec.projection_dim == 640 and spec.verified
    by_shape = sum(
        math.prod(shape) // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1] for _, shape, qtype in projector_tensors(GEMMA3_SIGLIP_TO_270M)
    )
    assert spec.weights_bytes == by_shape


def test_a_text_model_or_a_broken_encoder_is_not_a_projector(tmp_path: Path) -> None:
    text_model = write_sparse_gguf(tmp_path / "rwkv.gguf", RWKV7_168M)
    with pytest.raises(ValueError, match="is a 'rwkv7' model, not a multimodal projector"):
        projector_spec(read_headers(str(text_model)))
    broken = _written(tmp_path, replace(SMALL, name="seven-heads", n_head=7))
    with pytest.raises(ValueError, match="7 heads of a 1152-wide encoder do not make an encoder"):
        projector_spec(read_headers(str(broken)))


def test_attention_scores_the_device_cannot_bind_are_planned_on_the_cpu(tmp_path: Path) -> None:
    spec = projector_spec(read_headers(str(_written(tmp_path, GEMMA3_SIGLIP_TO_270M))))
    scores = 4 * 16 * 4096 * 4096
    split = projector_usage(spec, on_gpu=True, flash_attn=False, max_tensor_bytes=LLVMPIPE_MAX_TENSOR_BYTES)
    assert split.host_compute_bytes >= scores and split.compute_bytes < scores
    assert "exceed what the device can bind" in split.notes[0]
    whole = projector_usage(spec, on_gpu=True, flash_attn=False, max_tensor_bytes=None)
    assert whole.host_compute_bytes == 0 and whole.compute_bytes > scores
    assert projector_usage(spec, on_gpu=True, flash_attn=True, max_tensor_bytes=LLVMPIPE_MAX_TENSOR_BYTES).host_compute_bytes == 0


@pytest.mark.parametrize(("shape", "flash_attn"), [(GEMMA3_SIGLIP_TO_270M, "on"), (GEMMA3_SIGLIP_TO_270M, "off"), (SMALL, "on"), (SMALL, "off")])
def test_projector_weights_and_compute_match_llama_server_on_the_cpu(assets: Assets, tmp_path: Path, shape: SparseProjector, flash_attn: str) -> None:
    path = _written(tmp_path, shape)
    usage = projector_usage(projector_spec(read_headers(str(path))), on_gpu=False, flash_attn=flash_attn == "on")
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, "--mmproj", str(path), "-fa", flash_attn, ctx=2048)
    with running(argv, tmp_path / "server.log", f"http://127.0.0.1:{port}/health") as log_path:
        log = log_path.read_text()
    assert "CLIP using CPU backend" in log
    assert float(_CLIP_WEIGHTS.findall(log)[-1]) == pytest.approx(usage.weights_bytes / _MIB, abs=0.006)
    assert _compute_by_buffer(log) == {"CPU": pytest.approx(usage.compute_bytes / _MIB, rel=0.01)}


def test_check_refuses_a_projector_made_for_another_width(assets: Assets, tmp_path: Path) -> None:
    other = _written(tmp_path, replace(SMALL, name="for-gemma-3-4b", text_embd=2560))
    result = run_cli("check", str(assets.gemma_gguf), "--mmproj", str(other), "--json")
    assert result.returncode == 2
    assert "makes 2560-wide embeddings; this gemma3 model takes 640" in result.stderr
    assert result.stdout == ""


def test_serve_plans_passes_and_verifies_the_projector_on_vulkan(assets: Assets, tmp_path: Path) -> None:
    """Without flash attention each head's 64 MiB of scores (1 GiB for 16 heads) exceeds the
    software device's 128 MiB buffers: the plan puts them on the CPU, as llama.cpp does."""
    path = _written(tmp_path, SHALLOW)
    args = ("--ctx", "4096", "--mmproj", str(path), "--port", str(free_port()))
    with serving(assets, tmp_path, *args, vulkan=True) as (process, ready):
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    argv = ready["argv"]
    assert argv[argv.index("--mmproj") + 1] == str(path) and "--no-mmproj-offload" not in argv
    planned = ready["plan"]["projector"]
    assert planned["device"] == "gpu" and planned["host_compute_bytes"] > 1024 * _MIB
    actual = ready["actual"]["projector"]
    assert actual["backend"] == "Vulkan0"
    assert actual["weights_bytes"] == pytest.approx(planned["weights_bytes"], abs=0.01 * _MIB)
    assert actual["compute_bytes"]["CPU"] == pytest.approx(planned["host_compute_bytes"], rel=0.01)
    assert ready["delta"]["verified"] is True, ready["delta"]
    gpu = next(device for device in ready["delta"]["devices"] if device["name"] != "host")
    assert abs(gpu["error"]) <= 0.05
    log = Path(ready["log"]).read_text()
    assert "CLIP using Vulkan0 backend" in log


def test_serve_refuses_mmproj_for_other_engines(assets: Assets, tmp_path: Path) -> None:
    path = _written(tmp_path, SMALL)
    result = run_cli("serve", str(assets.gemma_gguf), "--engine", "ollama", "--mmproj", str(path))
    assert result.returncode == 2
    assert "--mmproj is planned and passed for llama-server only" in result.stderr
    assert json.dumps(result.stdout) == '""'
