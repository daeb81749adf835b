"""A multimodal projector (llama-server's ``--mmproj``): its weights and the compute buffer
llama.cpp's ``clip`` loader reserves for it, on the device that holds it. Pure.

llama-server loads the projector after the text model, on the first GPU unless told
``--no-mmproj-offload`` (then, or without a GPU, in system RAM; the weights are read into an
allocated buffer, not mapped). At load it reserves the encoder's compute graph for its warm-up
image (``image_size`` × ``image_size`` for the ViT encoders): that buffer stays allocated.

The ViT compute rule follows the graph ``clip_graph::build_vit`` builds, with N patches of
width E, FFN width F and H heads, in F32 (bytes):

- the FFN step holds the FFN's hidden state and three activations: ``4·(N·F + 3·N·E)``;
- the attention step holds six activations and, without flash attention, the N×N score
  matrix of every head: ``4·(6·N·E + H·N²)``;
- the buffer is the larger of the two. A score matrix larger than the device can bind (Vulkan's
  buffer limit) is not computed there: the scores, their softmax and both attention products
  run on the CPU, which then holds the scores and three activations.

Measured against the real engine for Gemma 3's SigLIP tower (tests/test_projector.py): exact on
the CPU with and without flash attention at 896 and 448 px.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..gguf.parse import GGUFHeader

__all__ = ["ProjectorSpec", "ProjectorUsage", "projector_spec", "projector_usage", "VERIFIED_PROJECTORS", "is_projector"]

#: Projector types whose compute rule was checked against a real load.
VERIFIED_PROJECTORS = frozenset({"gemma3"})
_F32 = 4


@dataclass(frozen=True)
class ProjectorSpec:
    """What the estimate needs from an mmproj header. Widths in elements, sizes in pixels."""

    source: str
    name: str
    projector_type: str
    has_vision: bool
    has_audio: bool
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    image_size: int
    patch_size: int
    #: The output width: it must equal the text model's embedding width.
    projection_dim: int
    #: Every tensor's bytes (the clip loader's "model size").
    weights_bytes: int

    @property
    def n_patches(self) -> int:
        """Patches of the warm-up image (the largest the compute buffer is reserved for)."""
        return (self.image_size // self.patch_size) ** 2 if self.has_vision and self.patch_size else 0

    @property
    def verified(self) -> bool:
        return self.projector_type in VERIFIED_PROJECTORS and self.has_vision and not self.has_audio

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "name": self.name,
            "projector_type": self.projector_type,
            "modalities": [m for m, present in (("vision", self.has_vision), ("audio", self.has_audio)) if present],
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_ff": self.n_ff,
            "n_head": self.n_head,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "projection_dim": self.projection_dim,
            "weights_bytes": self.weights_bytes,
            "verified": self.verified,
        }


@dataclass(frozen=True)
class ProjectorUsage:
    """Where the projector goes and what it takes there (bytes)."""

    on_gpu: bool
    weights_bytes: int
    #: The compute buffer on the projector's device.
    compute_bytes: int
    #: Compute the CPU holds for a projector on the GPU (attention the device cannot bind).
    host_compute_bytes: int
    flash_attn: bool
    n_patches: int
    notes: tuple[str, ...]

    @property
    def device_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "device": "gpu" if self.on_gpu else "host",
            "weights_bytes": self.weights_bytes,
            "compute_bytes": self.compute_bytes,
            "host_compute_bytes": self.host_compute_bytes,
            "flash_attn": self.flash_attn,
            "n_patches": self.n_patches,
            "notes": list(self.notes),
        }


def is_projector(header: GGUFHeader) -> bool:
    """Whether a GGUF is a clip/mmproj file rather than a text model."""
    return header.metadata.get("general.architecture") == "clip"


def _uint(metadata: Mapping[str, object], key: str, default: int = 0) -> int:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a count")
    return value


def projector_spec(headers: Sequence[GGUFHeader]) -> ProjectorSpec:
    """The projector an mmproj GGUF describes.

    Raises:
        ValueError: not an mmproj file, or its encoder sizes are missing or inconsistent.
    """
    header = headers[0]
    meta = header.metadata
    if not is_projector(header):
        raise ValueError(f"{header.source} is a {meta.get('general.architecture')!r} model, not a multimodal projector (general.architecture 'clip')")
    has_vision = bool(meta.get("clip.has_vision_encoder", False))
    has_audio = bool(meta.get("clip.has_audio_encoder", False))
    if not has_vision and not has_audio:
        raise ValueError(f"{header.source} has neither a vision nor an audio encoder (clip.has_vision_encoder / clip.has_audio_encoder)")
    prefix = "clip.vision" if has_vision else "clip.audio"
    projector_type = meta.get("clip.vision.projector_type" if has_vision and "clip.vision.projector_type" in meta else "clip.projector_type", "")
    spec = ProjectorSpec(
        source=header.source,
        name=str(meta.get("general.name", "")),
        projector_type=str(projector_type),
        has_vision=has_vision,
        has_audio=has_audio,
        n_layer=_uint(meta, f"{prefix}.block_count"),
        n_embd=_uint(meta, f"{prefix}.embedding_length"),
        n_ff=_uint(meta, f"{prefix}.feed_forward_length"),
        n_head=_uint(meta, f"{prefix}.attention.head_count"),
        image_size=_uint(meta, "clip.vision.image_size") if has_vision else 0,
        patch_size=_uint(meta, "clip.vision.patch_size") if has_vision else 0,
        projection_dim=_uint(meta, f"{prefix}.projection_dim"),
        weights_bytes=sum(t.n_bytes for h in headers for t in h.tensors),
    )
    if has_vision and (spec.patch_size == 0 or spec.image_size < spec.patch_size or spec.n_head == 0 or spec.n_embd % spec.n_head):
        raise ValueError(
            f"{header.source}: image {spec.image_size} px, patch {spec.patch_size} px, {spec.n_head} heads of a {spec.n_embd}-wide encoder do not "
            "make an encoder"
        )
    return spec


def projector_usage(spec: ProjectorSpec, *, on_gpu: bool, flash_attn: bool, max_tensor_bytes: int | None = None) -> ProjectorUsage:
    """The projector's weights and compute buffer on its device (the GPU when ``on_gpu``),
    with flash attention on or off as llama-server passes ``-fa`` to it."""
    notes: list[str] = []
    n, e, f, h = spec.n_patches, spec.n_embd, spec.n_ff, spec.n_head
    ffn_step = _F32 * (n * f + 3 * n * e)
    activations = _F32 * 6 * n * e
    scores = 0 if flash_attn else _F32 * h * n * n
    host_compute = 0
    if on_gpu and scores and max_tensor_bytes is not None and scores > max_tensor_bytes:
        compute = max(ffn_step, activations)
        host_compute = scores + _F32 * 3 * n * e
        notes.append(f"the attention scores ({scores / 2**20:,.0f} MiB per image) exceed what the device can bind: llama.cpp runs them on the CPU")
    else:
        compute = max(ffn_step, activations + scores)
    if spec.has_audio:
        notes.append("the audio encoder's compute buffer is not estimated")
    if not spec.verified:
        notes.append(f"projector type {spec.projector_type!r}: the compute buffer uses the ViT rule, not checked against a real load of this type")
    return ProjectorUsage(on_gpu, spec.weights_bytes, compute, host_compute, flash_attn, n, tuple(notes))
