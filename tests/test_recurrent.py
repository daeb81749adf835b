"""Recurrent and hybrid state from the header, against llama.cpp's own arithmetic worked by hand
(llama_hparams::n_embd_r / n_embd_s, the layer filters of create_memory). Shapes are the
published configs' where the comment names one; the GGUF keys are what llama.cpp reads."""

from __future__ import annotations

import pytest

from tierlocal.errors import HeaderError
from tierlocal.fit.memory import kv_cache, server_context
from tierlocal.fit.model import model_spec
from tierlocal.gguf.parse import GGUFHeader


def _spec(arch: str, n_layer: int, n_embd: int, extra: dict[str, object]):  # type: ignore[no-untyped-def]
    metadata: dict[str, object] = {
        "general.architecture": arch,
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.context_length": 4096,
        "tokenizer.ggml.tokens": ["a", "b"],
        **extra,
    }
    return model_spec([GGUFHeader("test.gguf", 3, metadata, (), 0, 0, 0, 32)])


def _layers(arch: str, n_layer: int, n_embd: int, extra: dict[str, object], *, ctx: int = 4096, parallel: int | None = 1) -> tuple[int, ...]:
    spec = _spec(arch, n_layer, n_embd, extra)
    return kv_cache(spec, server_context(spec, ctx=ctx, parallel=parallel)).layer_bytes


def test_qwen3_next_gated_delta_net_every_fourth_layer_attends() -> None:
    """Qwen3-Next-80B-A3B: 48 layers, full attention every 4th; linear attention with 16 key
    heads of 128, 32 value heads of 128, conv kernel 4; attention 16 heads, 2 KV heads of 256."""
    extra = {
        "qwen3next.attention.head_count": 16,
        "qwen3next.attention.head_count_kv": 2,
        "qwen3next.attention.key_length": 256,
        "qwen3next.attention.value_length": 256,
        "qwen3next.ssm.conv_kernel": 4,
        "qwen3next.ssm.state_size": 128,
        "qwen3next.ssm.group_count": 16,
        "qwen3next.ssm.time_step_rank": 32,
        "qwen3next.ssm.inner_size": 4096,
        "qwen3next.full_attention_interval": 4,
    }
    layers = _layers("qwen3next", 48, 2048, extra, parallel=2)
    state = (3 * (4096 + 2 * 16 * 128) + 128 * 4096) * 4 * 2  # F32, two sequences
    kv = 2 * 256 * 2 * 2 * 4096  # K and V, f16, 4096 cells per stream, two streams of 2048 each
    assert [size for il, size in enumerate(layers) if (il + 1) % 4] == [state] * 36
    assert [size for il, size in enumerate(layers) if (il + 1) % 4 == 0] == [kv] * 12


def test_an_explicit_recurrent_layer_array_wins_over_the_interval() -> None:
    pattern = [True, False, True, True]
    extra = {
        "qwen35.attention.head_count": 8,
        "qwen35.attention.head_count_kv": 2,
        "qwen35.attention.key_length": 128,
        "qwen35.ssm.conv_kernel": 4,
        "qwen35.ssm.state_size": 128,
        "qwen35.ssm.group_count": 8,
        "qwen35.ssm.inner_size": 2048,
        "qwen35.attention.recurrent_layers": pattern,
        "qwen35.full_attention_interval": 2,
    }
    spec = _spec("qwen35", 4, 1024, extra)
    assert spec.is_recurrent == tuple(pattern) and spec.recurrent_family == "gated delta net"


def test_multi_token_prediction_blocks_keep_no_state_no_kv_and_load_no_weights() -> None:
    """Qwen3.5 converted with its MTP block: block_count counts it (and so do -ngl's layers),
    but llama-server skips its tensors and gives it neither a KV cache nor a state."""
    from tierlocal.gguf.parse import TensorInfo

    extra = {
        "qwen35.attention.head_count": 16,
        "qwen35.attention.head_count_kv": 4,
        "qwen35.attention.key_length": 256,
        "qwen35.ssm.conv_kernel": 4,
        "qwen35.ssm.state_size": 128,
        "qwen35.ssm.group_count": 16,
        "qwen35.ssm.time_step_rank": 32,
        "qwen35.ssm.inner_size": 4096,
        "qwen35.full_attention_interval": 4,
        "qwen35.nextn_predict_layers": 1,
    }
    tensors = tuple(TensorInfo(f"blk.{il}.ffn_up.weight", (4096, 12288), "Q4_K", il * 1000, 4096 * 12288, 1000) for il in range(9))
    metadata: dict[str, object] = {
        "general.architecture": "qwen35",
        "qwen35.block_count": 9,
        "qwen35.embedding_length": 4096,
        "qwen35.context_length": 4096,
        "tokenizer.ggml.tokens": ["a", "b"],
        **extra,
    }
    spec = model_spec([GGUFHeader("test.gguf", 3, metadata, tensors, 0, 0, 0, 32)])
    assert spec.n_layer == 9  # -ngl counts the MTP block as a layer
    # Block 8 would be a delta net by the interval; as an MTP block it is neither that nor attention.
    assert spec.is_recurrent == (True, True, True, False, True, True, True, False, False)
    assert spec.n_head_kv[8] == 0 and spec.n_head_kv[7] == 4
    layers = kv_cache(spec, server_context(spec, ctx=4096, parallel=1)).layer_bytes
    assert layers[8] == 0 and layers[7] == 4 * 256 * 2 * 2 * 4096
    assert [t.layer for t in spec.tensors] == list(range(8))  # blk.8's tensors are not loaded


def test_more_mtp_blocks_than_blocks_is_refused() -> None:
    with pytest.raises(HeaderError, match="multi-token-prediction"):
        _spec("qwen35", 4, 1024, {"qwen35.attention.head_count": 8, "qwen35.nextn_predict_layers": 5})


def test_granite_hybrid_mamba2_layers_are_those_without_kv_heads() -> None:
    """Granite 4.0 H style: Mamba-2 mixer d_inner = 2 × n_embd, d_state 128, one group, conv 4."""
    kv_heads = [0, 0, 0, 4, 0, 0, 0, 4]
    extra = {
        "granitehybrid.attention.head_count": 12,
        "granitehybrid.attention.head_count_kv": kv_heads,
        "granitehybrid.attention.key_length": 128,
        "granitehybrid.ssm.conv_kernel": 4,
        "granitehybrid.ssm.state_size": 128,
        "granitehybrid.ssm.group_count": 1,
        "granitehybrid.ssm.inner_size": 3072,
        "granitehybrid.ssm.time_step_rank": 48,
    }
    layers = _layers("granitehybrid", 8, 1536, extra, parallel=None)  # llama-server's 4 unified slots
    state = (3 * (3072 + 2 * 1 * 128) + 128 * 3072) * 4 * 4
    kv = 4 * 128 * 2 * 2 * 4096
    assert layers == tuple(kv if heads else state for heads in kv_heads)


def test_nemotron_h_mlp_only_layers_keep_nothing() -> None:
    kv_heads, ff = [0, 0, 8, 0], [0, 1024, 0, 0]  # Mamba-2, MLP, attention, Mamba-2
    extra = {
        "nemotron_h.attention.head_count": 32,
        "nemotron_h.attention.head_count_kv": kv_heads,
        "nemotron_h.feed_forward_length": ff,
        "nemotron_h.attention.key_length": 128,
        "nemotron_h.ssm.conv_kernel": 4,
        "nemotron_h.ssm.state_size": 128,
        "nemotron_h.ssm.group_count": 8,
        "nemotron_h.ssm.inner_size": 8192,
    }
    layers = _layers("nemotron_h", 4, 4096, extra)
    state = (3 * (8192 + 2 * 8 * 128) + 128 * 8192) * 4
    assert layers == (state, 0, 8 * 128 * 2 * 2 * 4096, state)


def test_falcon_h1_every_layer_keeps_kv_and_state() -> None:
    extra = {
        "falcon-h1.attention.head_count": 8,
        "falcon-h1.attention.head_count_kv": 2,
        "falcon-h1.attention.key_length": 128,
        "falcon-h1.ssm.conv_kernel": 4,
        "falcon-h1.ssm.state_size": 256,
        "falcon-h1.ssm.group_count": 1,
        "falcon-h1.ssm.inner_size": 2048,
    }
    layers = _layers("falcon-h1", 3, 1024, extra)
    state = (3 * (2048 + 2 * 256) + 256 * 2048) * 4
    assert layers == (state + 2 * 128 * 2 * 2 * 4096,) * 3


def test_pure_mamba_and_rwkv_keep_no_kv_at_all() -> None:
    mamba = {"mamba.attention.head_count": 0, "mamba.ssm.conv_kernel": 4, "mamba.ssm.state_size": 16, "mamba.ssm.inner_size": 5120}
    assert _layers("mamba", 2, 2560, mamba) == ((3 * 5120 + 16 * 5120) * 4,) * 2  # Mamba-1: no groups
    rwkv = {"rwkv7.attention.head_count": 0, "rwkv7.wkv.head_size": 64}
    assert _layers("rwkv7", 2, 2048, rwkv, parallel=3) == ((2 * 2048 + 2048 * 64) * 4 * 3,) * 2


def test_kimi_delta_attention_layers_and_mla_layers() -> None:
    """Kimi-Linear-48B-A3B style: KDA heads of 128 (32 heads, conv 4) beside MLA layers."""
    kv_heads = [0, 0, 0, 32]
    extra = {
        "kimi-linear.attention.head_count": 32,
        "kimi-linear.attention.head_count_kv": kv_heads,
        "kimi-linear.attention.key_length": 576,
        "kimi-linear.attention.value_length": 512,
        "kimi-linear.attention.key_length_mla": 192,
        "kimi-linear.attention.value_length_mla": 128,
        "kimi-linear.attention.kv_lora_rank": 512,
        "kimi-linear.ssm.conv_kernel": 4,
        "kimi-linear.kda.head_dim": 128,
    }
    layers = _layers("kimi-linear", 4, 2304, extra)
    state = (3 * 3 * 32 * 128 + 128 * 128 * 32) * 4
    assert layers[:3] == (state,) * 3
    assert layers[3] > 0  # the MLA layer keeps its latent cache (the MLA rules are tested elsewhere)


def test_an_unknown_architecture_gets_the_generic_estimate_with_its_state_named() -> None:
    """MiniMax-01's lightning attention is outside the modelled families: attention KV from the
    header's shape, the state's keys named, the architecture marked unverified."""
    extra = {"minimax-01.attention.head_count": 8, "minimax-01.attention.head_count_kv": 2, "minimax-01.linear_attention.head_dim": 128}
    spec = _spec("minimax-01", 2, 1024, extra)
    assert not spec.verified and spec.unknown_state == ("linear_attention.head_dim",)
    assert kv_cache(spec, server_context(spec, ctx=4096, parallel=1)).layer_bytes == (2 * 128 * 2 * 2 * 4096,) * 2


def test_a_self_contradictory_header_is_refused() -> None:
    with pytest.raises(HeaderError, match="layer 1 has 16 KV heads for 8 attention heads"):
        _spec("qwen3", 2, 1024, {"qwen3.attention.head_count": 8, "qwen3.attention.head_count_kv": [8, 16]})
