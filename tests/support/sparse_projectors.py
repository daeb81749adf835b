"""Vision projector (mmproj) GGUFs whose header is a real encoder (the tensor names, shapes and
types llama.cpp's ``clip`` loader reads, as the pinned ``convert_hf_to_gguf.py`` writes them)
and whose data region is a sparse hole: llama-server loads them beside a text model, reserves
their compute buffer, and logs its real allocations.

The vision towers follow the models' published config.json ``vision_config``; only the output
projection's width is the text model's we load them with (mtmd refuses a projector whose
output width differs from the text model's embedding width)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from tierlocal.gguf.synthetic import SparseWriter, finish_with_tensors

Q = GGMLQuantizationType


@dataclass(frozen=True)
class SparseProjector:
    """A ViT-style vision encoder and its projector (``projector_type`` as clip.cpp names it)."""

    name: str
    projector_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    image_size: int
    patch_size: int
    #: The text model's embedding width (the projector's output width).
    text_embd: int
    weight_type: GGMLQuantizationType = Q.F16


#: Gemma 3 4B/12B/27B's SigLIP-so400m tower (google/gemma-3-4b-it config.json vision_config:
#: hidden 1152, intermediate 4304, 27 layers, 16 heads, 896 px, patch 14), projected to the
#: 640-wide Gemma 3 270M we load it with (the published 4B projects to 2560).
GEMMA3_SIGLIP_TO_270M = SparseProjector("gemma-3-siglip-mmproj-f16", "gemma3", 27, 1152, 4304, 16, 896, 14, 640)


def projector_tensors(spec: SparseProjector) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """(name, ggml shape ne0-first, type) of every tensor the clip loader reads for ``spec``."""
    f32, w, e, f = Q.F32, spec.weight_type, spec.n_embd, spec.n_ff
    n_patches = (spec.image_size // spec.patch_size) ** 2
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]] = [
        ("v.patch_embd.weight", (spec.patch_size, spec.patch_size, 3, e), f32),
        ("v.patch_embd.bias", (e,), f32),
        ("v.position_embd.weight", (e, n_patches), f32),
    ]
    for il in range(spec.n_layer):
        blk = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors += [(blk + name + ".weight", (e, e), w), (blk + name + ".bias", (e,), f32)]
        tensors += [
            (blk + "ln1.weight", (e,), f32),
            (blk + "ln1.bias", (e,), f32),
            (blk + "ln2.weight", (e,), f32),
            (blk + "ln2.bias", (e,), f32),
            (blk + "ffn_up.weight", (e, f), w),
            (blk + "ffn_up.bias", (f,), f32),
            (blk + "ffn_down.weight", (f, e), w),
            (blk + "ffn_down.bias", (e,), f32),
        ]
    tensors += [("v.post_ln.weight", (e,), f32), ("v.post_ln.bias", (e,), f32)]
    if spec.projector_type == "gemma3":
        tensors += [("mm.soft_emb_norm.weight", (e,), f32), ("mm.input_projection.weight", (spec.text_embd, e), Q.F16)]
    else:
        raise ValueError(f"no tensor layout for projector type {spec.projector_type}")
    return tensors


def write_sparse_projector(path: Path, spec: SparseProjector) -> Path:
    """Write ``spec`` as an mmproj GGUF whose tensor data is a hole; returns ``path``."""
    writer = SparseWriter(path, "clip")
    writer.add_string("general.name", spec.name)
    writer.add_uint32("general.file_type", 1)
    writer.add_string("clip.projector_type", spec.projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    for key, value in {
        "image_size": spec.image_size,
        "patch_size": spec.patch_size,
        "embedding_length": spec.n_embd,
        "feed_forward_length": spec.n_ff,
        "projection_dim": spec.text_embd,
        "block_count": spec.n_layer,
        "attention.head_count": spec.n_head,
    }.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return finish_with_tensors(writer, path, projector_tensors(spec))
