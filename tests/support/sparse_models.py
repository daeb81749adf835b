"""GGUF files whose header is a real architecture (tensor names, shapes, quantisation types as
llama.cpp expects them) and whose data region is a sparse hole: llama.cpp loads them (zero
weights) and reports its real allocations, while nothing big is downloaded or stored.

The shapes follow the models' published config.json values."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tierlocal.gguf.synthetic import SparseWriter, add_placeholder_vocab, finish_with_tensors

Q = GGMLQuantizationType


@dataclass(frozen=True)
class SparseArch:
    """A transformer shape to write. ``experts`` = (count, used, expert FFN width) for MoE."""

    name: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    tied_output: bool = False
    qk_norm: bool = False
    experts: tuple[int, int, int] | None = None
    weight_type: GGMLQuantizationType = Q.Q4_K
    output_type: GGMLQuantizationType = Q.Q6_K
    extra: dict[str, int | float] = field(default_factory=dict)
    #: MLA attention (DeepSeek-V2): (kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    mla: tuple[int, int, int, int] | None = None
    n_expert_shared: int = 0
    dense_lead: int = 0
    #: LFM2-style hybrid: the blocks with attention (the rest are short-convolution blocks)
    #: and the convolution's cache length.
    attention_layers: tuple[int, ...] | None = None
    conv_l_cache: int = 0
    #: tokenizer.chat_template (None: the file has none).
    chat_template: str | None = None
    #: Byte tokens in the vocabulary, so the file takes text (a chat request) and not only token ids.
    text_vocab: bool = False
    #: Qwen3-Next gated delta nets: (d_conv, key heads, value heads, head size, full-attention
    #: interval); every interval-th block is full attention, the others delta nets.
    gated_delta_net: tuple[int, int, int, int, int] | None = None
    #: RWKV-7: (head size, decay, in-context learning rate, value residual and gate LoRA ranks).
    rwkv7: tuple[int, int, int, int, int] | None = None
    #: Kimi-Linear: Kimi Delta Attention in the blocks that are not attention_layers (MLA ones):
    #: (d_conv, KDA head size).
    kda: tuple[int, int] | None = None
    #: Falcon-H1 (every block runs attention and a Mamba-2 mixer side by side, then an MLP):
    #: (d_conv, d_state, n_group, n_ssm_head, d_inner).
    falcon_h1: tuple[int, int, int, int, int] | None = None
    #: Mamba-1 (every block a selective-scan mixer, no attention, no MLP): (d_conv, d_state,
    #: dt_rank), with d_inner = 2 × n_embd.
    mamba1: tuple[int, int, int] | None = None
    #: Nemotron-H: one character per block, M a Mamba-2 mixer, - an MLP, * attention (its
    #: hybrid_override_pattern); with mamba2 for the mixers' shape (d_inner from them).
    nemotron_pattern: str | None = None
    #: Granite-4-H style Mamba-2 mixers in the blocks that are not attention_layers:
    #: (d_conv, d_state, n_group, n_ssm_head), with d_inner = 2 × n_embd.
    mamba2: tuple[int, int, int, int] | None = None
    #: Kimi K3 (kimi-k3.cpp): (q_lora_rank, expert latent width) — KDA with a full-rank gate,
    #: MLA with a query LoRA and an output gate, routed experts in a latent space, and the
    #: attention-residual scores; with kda, mla and experts for the shapes.
    kimi_k3: tuple[int, int] | None = None
    #: RWKV-6: (head size, time-mix LoRA width, time-decay LoRA width).
    rwkv6: tuple[int, int, int] | None = None
    #: Jamba: the blocks whose FFN is the experts (the others dense).
    expert_layers: tuple[int, ...] | None = None
    #: Gemma 3: a norm after attention and after the FFN in every block (post_attention_norm,
    #: post_ffw_norm), and the sliding window the 5-of-6 local layers see.
    post_norms: bool = False
    sliding_window: int = 0
    #: gpt-oss (llama.cpp's openai-moe.cpp): biased attention with per-head sinks, a post-attention
    #: norm, experts with biases and a biased router; the rope spans the head (head_dim).
    gpt_oss: bool = False
    #: Multi-token-prediction blocks after the trunk ({arch}.nextn_predict_layers; Qwen3.5's
    #: converter writes one): a full-attention block with the nextn projections, which
    #: llama-server skips unless speculative MTP decoding is asked for.
    mtp_layers: int = 0
    #: Gemma 4 (llama.cpp's gemma4.cpp): (full-attention head size, full-attention KV heads,
    #: period, K doubles as V). Every period-th block is full attention with those, without
    #: attn_v where K doubles as V (attention_k_eq_v = 1); the others see sliding_window tokens
    #: with head_dim and n_head_kv. With experts (26B-A4B), every block runs them beside its
    #: dense FFN.
    gemma4: tuple[int, int, int, int] | None = None
    #: Gemma 4 E2B/E4B per-layer embeddings (hidden_size_per_layer_input): a second embedding
    #: table of that width per block, projected into every block.
    per_layer_embd: int = 0
    #: Biases on the Q, K and V projections (Qwen2, Seed-OSS: attention_bias in config.json).
    qkv_bias: bool = False
    #: Phi-3's fused projections: one attn_qkv and an ffn_up of gate and up together (2 × n_ff).
    fused_qkv: bool = False
    #: Where a block's norms sit: "pre" (attn_norm, ffn_norm: Llama), "post" (post_attention_norm
    #: and post_ffw_norm after each sub-block, none before: OLMo 2, EXAONE 4) or "seed"
    #: (attn_norm, then post_attention_norm before the FFN: Seed-OSS).
    norm_layout: str = "pre"
    #: OLMo 2's q/k norms span every head (n_embd and the KV width), not one head.
    qk_norm_full: bool = False
    #: Phi-4-mini's LongRoPE factors (rope_factors_long/short.weight, head_dim × partial ÷ 2 each).
    rope_factors: int = 0


LLAMA3_8B = SparseArch("llama-3-8b-q4k", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, extra={"llama.rope.freq_base": 500000.0})
QWEN3_8B = SparseArch("qwen3-8b-q4k", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, qk_norm=True)
# Qwen/Qwen3-1.7B config.json: hidden_size 2048, intermediate_size 6144, 28 layers, 16 heads, 8 KV heads,
# head_dim 128, vocab_size 151936, tie_word_embeddings true, max_position_embeddings 40960.
QWEN3_1_7B = SparseArch("qwen3-1.7b-q4k", "qwen3", 28, 2048, 16, 8, 128, 6144, 151936, 40960, tied_output=True, qk_norm=True)
QWEN3_30B_A3B = SparseArch("qwen3-30b-a3b-q4k", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, qk_norm=True, experts=(128, 8, 768))
# LFM2-1.2B: 10 short-convolution blocks with a fixed-size recurrent state, 6 attention blocks.
LFM2_1_2B = SparseArch(
    "lfm2-1.2b-q4k",
    "lfm2",
    16,
    2048,
    32,
    8,
    64,
    8192,
    65536,
    128000,
    tied_output=True,
    qk_norm=True,
    attention_layers=(2, 5, 8, 10, 12, 14),
    conv_l_cache=3,
)
# Granite-4.0-H-350M (ibm-granite/granite-4.0-h-350m config.json, as the model's published
# config gives it): 32 blocks, attention in 10, 13, 17 and 27 (12 heads, 4 KV heads of 64), the
# rest Mamba-2 (48 heads of 32, d_state 128, one group, conv 4), a 2,048-wide dense MLP in every
# block, vocabulary 100,352, tied embeddings.
GRANITE_4_H_350M = SparseArch(
    "granite-4.0-h-350m-q4k",
    "granitehybrid",
    32,
    768,
    12,
    4,
    64,
    2048,
    100352,
    32768,
    tied_output=True,
    attention_layers=(10, 13, 17, 27),
    mamba2=(4, 128, 1, 48),
)
# Qwen3-Next-80B-A3B (its published config.json: Qwen/Qwen3-Coder-Next shares it): hidden 2048,
# full attention every 4th block (16 heads with an output gate, 2 KV heads of 256, q/k norms),
# gated delta nets elsewhere (16 key heads and 32 value heads of 128, conv 4), 512 experts (10
# used) of 512 plus a shared expert of 512, vocabulary 151,936. Depth reduced from 48 blocks to
# 4 (3 delta-net + 1 attention; the width is the published one) so its experts fit this disk's
# page cache.
QWEN3_NEXT_4L = SparseArch(
    "qwen3-next-80b-a3b-4-blocks-q4k",
    "qwen3next",
    4,
    2048,
    16,
    2,
    256,
    5120,
    151936,
    262144,
    qk_norm=True,
    experts=(512, 10, 512),
    n_expert_shared=1,
    gated_delta_net=(4, 16, 32, 128, 4),
)
# Qwen3.5-9B (Qwen/Qwen3.5-9B model card and config.json text_config): width 4096, full
# attention every 4th block (16 heads with an output gate, 4 KV heads of 256, q/k norms), gated
# delta nets elsewhere (16 key heads and 32 value heads of 128, conv 4), a dense FFN of 12,288,
# vocabulary 248,320, untied output (the GGUF's 8.95B weights count it). The first 8 of its 32
# blocks, width kept; with its one multi-token-prediction block when mtp_layers=1.
QWEN35_9B_8L = SparseArch(
    "qwen3.5-9b-8-blocks-q4k",
    "qwen35",
    8,
    4096,
    16,
    4,
    256,
    12288,
    248320,
    262144,
    qk_norm=True,
    gated_delta_net=(4, 16, 32, 128, 4),
)
# Qwen3.5-35B-A3B (its config.json text_config): width 2048, full attention every 4th block (16
# heads with an output gate, 2 KV heads of 256), gated delta nets elsewhere (16 key and 32 value
# heads of 128, conv 4), 256 experts (8 used) of 512 plus a shared expert of 512, vocabulary
# 248,320, untied output. The first 4 of its 40 blocks, width kept.
QWEN35_35B_A3B_4L = SparseArch(
    "qwen3.5-35b-a3b-4-blocks-q4k",
    "qwen35moe",
    4,
    2048,
    16,
    2,
    256,
    512,
    248320,
    262144,
    qk_norm=True,
    experts=(256, 8, 512),
    n_expert_shared=1,
    gated_delta_net=(4, 16, 32, 128, 4),
)
# NVIDIA-Nemotron-Nano-9B-v2 (its published config.json): hidden 4480, Mamba-2 mixers of 128
# heads × 80 (d_state 128, 8 groups, conv 4), MLPs of 15,680 (squared ReLU: up and down only),
# attention of 40 heads with 8 KV heads of 128, vocabulary 131,072. The first 16 of its 56
# blocks (8 Mamba-2, 7 MLP, 1 attention), width kept; Q8_0, since 4480 is not whole Q4_K blocks.
NEMOTRON_H_9B_16L = SparseArch(
    "nemotron-nano-9b-v2-16-blocks-q8",
    "nemotron_h",
    16,
    4480,
    40,
    8,
    128,
    15680,
    131072,
    131072,
    weight_type=Q.Q8_0,
    output_type=Q.Q8_0,
    mamba2=(4, 128, 8, 128),
    nemotron_pattern="M-M-M-MM-M-M-M*-",
)
# Mamba-2.8B (state-spaces/mamba-2.8b, its published config): 64 blocks of width 2560, d_inner
# 5120 (expand 2), d_state 16, conv 4, dt_rank 160, vocabulary 50,280 (the GGUF pads it to
# 50,288), tied embeddings. Full depth.
MAMBA_2_8B = SparseArch(
    "mamba-2.8b-q4k",
    "mamba",
    64,
    2560,
    0,
    0,
    0,
    0,
    50288,
    1048576,
    tied_output=True,
    mamba1=(4, 16, 160),
)
# Falcon-H1-1.5B (tiiuae/Falcon-H1-1.5B-Instruct, its published config): 24 blocks of width
# 2048, each with attention (8 heads, 2 KV heads of 128) beside a Mamba-2 mixer (48 heads of 64,
# d_ssm 3072, d_state 256, one group, conv 4), an MLP of 4608, vocabulary 65,537. Full depth.
FALCON_H1_1_5B = SparseArch(
    "falcon-h1-1.5b-q4k",
    "falcon-h1",
    24,
    2048,
    8,
    2,
    128,
    4608,
    65537,
    131072,
    falcon_h1=(4, 256, 1, 48, 3072),
)
# Kimi-Linear-48B-A3B (moonshotai/Kimi-Linear-48B-A3B-Instruct, its released config): hidden
# 2304; Kimi Delta Attention (32 heads of 128, conv 4) in 3 of every 4 blocks, MLA in the
# others (32 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, no q compression);
# 256 experts (8 used) of 1024 plus one shared, the first block dense (9216); vocabulary
# 163,840. Its first 4 blocks (3 KDA, then MLA, as the released pattern starts), width kept.
KIMI_LINEAR_4L = SparseArch(
    "kimi-linear-48b-a3b-4-blocks-q4k",
    "kimi-linear",
    4,
    2304,
    32,
    1,
    192,
    9216,
    163840,
    1048576,
    experts=(256, 8, 1024),
    mla=(512, 128, 64, 128),
    n_expert_shared=1,
    dense_lead=1,
    attention_layers=(3,),
    kda=(4, 128),
)
# Kimi K3 (moonshotai/Kimi-K3 config.json text_config, 2026-07): width 7168, 96 heads; KDA
# heads of 128 with a 4-wide convolution; MLA with kv_lora_rank 512, q_lora_rank 1536, nope 128 +
# rope 64, values of 128; 896 routed experts (16 used) of 3072 in a 3584-wide latent space, 2
# shared; the first block dense (33792). Depth reduced from 93 to 2 blocks, one of each kind
# (block 0: KDA with the dense FFN, as K3's; block 1: MLA with experts); width kept. Experts in
# MXFP4 (as shipped), the rest Q8_0: about 20 GB of holes.
KIMI_K3_2L = SparseArch(
    "kimi-k3-2-blocks-mxfp4",
    "kimi-k3",
    2,
    7168,
    96,
    1,
    192,
    33792,
    163840,
    1048576,
    experts=(896, 16, 3072),
    mla=(512, 128, 64, 128),
    n_expert_shared=2,
    dense_lead=1,
    attention_layers=(1,),
    kda=(4, 128),
    kimi_k3=(1536, 3584),
    weight_type=Q.Q8_0,
    output_type=Q.Q8_0,
    extra={
        "kimi-k3.attn_res.block_size": 12,
        "kimi-k3.activation.situ_beta": 4.0,
        "kimi-k3.activation.situ_linear_beta": 25.0,
        "kimi-k3.expert_latent_length": 3584,
        "kimi-k3.attention.q_lora_rank": 1536,
    },
)
# RWKV-6 World 1.6B (RWKV/rwkv-6-world-1b6 config.json: 24 blocks of width 2048, heads of 64,
# vocabulary 65536; the FFN width and LoRA widths as llama.cpp's converter derives them:
# 3.5 × 2048 = 7168, 32 and 64). Full depth.
RWKV6_1B6 = SparseArch("rwkv6-world-1b6-q4k", "rwkv6", 24, 2048, 0, 0, 0, 7168, 65536, 1048576, rwkv6=(64, 32, 64))
# AI21-Jamba-1.5-Mini (ai21labs/AI21-Jamba-1.5-Mini config.json): width 4096, 32 heads (8 KV),
# Mamba-1 mixers (d_conv 4, d_state 16, dt_rank 256, expand 2) except attention every 8th block
# from block 4, 16 experts of 14336 (2 used) in every 2nd block from block 1. Depth reduced from
# 32 to 8 blocks (one period of the pattern); width kept.
JAMBA_MINI_8L = SparseArch(
    "ai21-jamba-1.5-mini-8-blocks-q4k",
    "jamba",
    8,
    4096,
    32,
    8,
    128,
    14336,
    65536,
    262144,
    experts=(16, 2, 14336),
    mamba1=(4, 16, 256),
    attention_layers=(4,),
    expert_layers=(1, 3, 5, 7),
)
# RWKV7-Goose-Pile-168M (RWKV/RWKV7-Goose-Pile-168M-HF, its published config): 12 blocks of
# width 768, heads of 64, channel mix of 3072, LoRA ranks decay 64, a (ICLR) 64, v 32, gate 128.
# The vocabulary is taken as 50,304 (the Pile tokenizer's; the state does not depend on it).
RWKV7_168M = SparseArch(
    "rwkv7-goose-pile-168m-q4k",
    "rwkv7",
    12,
    768,
    0,
    0,
    0,
    3072,
    50304,
    1048576,
    rwkv7=(64, 64, 64, 32, 128),
)
# gpt-oss-20b (openai/gpt-oss-20b config.json): width 2880, 64 heads and 8 KV heads of 64, a
# 128-token sliding window in every other block (from the first), 32 experts (4 used) of 2880
# in MXFP4 with the rest Q8_0 (llama-quantize's MXFP4_MOE), vocabulary 201,088. The first 4 of
# its 24 blocks, width kept.
GPT_OSS_20B_4L = SparseArch(
    "gpt-oss-20b-4-blocks-mxfp4",
    "gpt-oss",
    4,
    2880,
    64,
    8,
    64,
    2880,
    201088,
    131072,
    experts=(32, 4, 2880),
    gpt_oss=True,
    sliding_window=128,
    weight_type=Q.Q8_0,
    output_type=Q.Q8_0,
)
# Gemma-4-31B (google/gemma-4-31B config.json text_config): width 5376, 32 heads; 5 of every 6
# blocks see a 1,024-token window with 16 KV heads of 256, the 6th attends globally with 4 KV
# heads of 512 whose K is also V; FFN 21,504, vocabulary 262,144, output tied to the embedding.
# Its first 6 blocks of 60, width kept.
GEMMA4_31B_6L = SparseArch(
    "gemma-4-31b-6-blocks-q4k",
    "gemma4",
    6,
    5376,
    32,
    16,
    256,
    21504,
    262144,
    262144,
    tied_output=True,
    sliding_window=1024,
    gemma4=(512, 4, 6, 1),
)
# Gemma-4-26B-A4B (google/gemma-4-26B-A4B config.json text_config): width 2816, 16 heads, 8
# sliding-window KV heads of 256 and 2 global ones of 512, a dense FFN of 2,112 beside 128
# experts of 704 (8 used) in every block. Its first 6 blocks of 30, width kept.
GEMMA4_26B_A4B_6L = SparseArch(
    "gemma-4-26b-a4b-6-blocks-q4k",
    "gemma4",
    6,
    2816,
    16,
    8,
    256,
    2112,
    262144,
    262144,
    tied_output=True,
    sliding_window=1024,
    gemma4=(512, 2, 6, 1),
    experts=(128, 8, 704),
)
# Gemma-4-E4B (google/gemma-4-E4B config.json text_config): width 2560, 8 heads and 2 KV heads
# (256 in the 1-in-6 sliding-window blocks' place, 512 in the global ones, K and V apart), a
# 512-token window, FFN 10,240, per-layer embeddings of 256, the last 18 of 42 blocks reading
# earlier caches. Its first 12 blocks, the last 6 sharing.
GEMMA4_E4B_12L = SparseArch(
    "gemma-4-e4b-12-blocks-q4k",
    "gemma4",
    12,
    2560,
    8,
    2,
    256,
    10240,
    262144,
    131072,
    tied_output=True,
    sliding_window=512,
    gemma4=(512, 2, 6, 0),
    per_layer_embd=256,
    extra={"gemma4.attention.shared_kv_layers": 6},
)
# DeepSeek-V2-Lite: MLA (kv_lora_rank 512, rope 64), 64 routed experts (6 used) + 2 shared,
# the first block dense. Rows that are not whole Q4_K blocks (1408, 128) use Q8_0.
DEEPSEEK_V2_LITE = SparseArch(
    "deepseek-v2-lite-q4k",
    "deepseek2",
    27,
    2048,
    16,
    1,
    192,
    10944,
    102400,
    163840,
    experts=(64, 6, 1408),
    mla=(512, 128, 64, 128),
    n_expert_shared=2,
    dense_lead=1,
)


def _block_quant(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> GGMLQuantizationType:
    """``qtype`` if the row is whole blocks of it, else Q8_0 (32-element blocks)."""
    return qtype if shape[0] % GGML_QUANT_SIZES[qtype][0] == 0 else Q.Q8_0


def _mla_block(spec: SparseArch, blk: str) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    assert spec.mla is not None
    kv_lora, nope, rope, v_dim = spec.mla
    shapes = [
        (blk + "attn_norm.weight", (spec.n_embd,)),
        (blk + "attn_q.weight", (spec.n_embd, spec.n_head * (nope + rope))),
        (blk + "attn_kv_a_mqa.weight", (spec.n_embd, kv_lora + rope)),
        (blk + "attn_kv_a_norm.weight", (kv_lora,)),
        (blk + "attn_k_b.weight", (nope, kv_lora, spec.n_head)),
        (blk + "attn_v_b.weight", (kv_lora, v_dim, spec.n_head)),
        (blk + "attn_output.weight", (spec.n_head * v_dim, spec.n_embd)),
        (blk + "ffn_norm.weight", (spec.n_embd,)),
    ]
    return [(name, shape, Q.F32 if len(shape) == 1 else _block_quant(spec.weight_type, shape)) for name, shape in shapes]


def _mamba2_block(spec: SparseArch, blk: str) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Granite-4-H Mamba-2 block (llama.cpp's granite-hybrid.cpp load_arch_tensors) and its MLP."""
    assert spec.mamba2 is not None
    d_conv, d_state, n_group, n_head = spec.mamba2
    d_inner = 2 * spec.n_embd
    conv_dim = d_inner + 2 * n_group * d_state
    f32, w = Q.F32, spec.weight_type
    return [
        (blk + "attn_norm.weight", (spec.n_embd,), f32),
        (blk + "ssm_in.weight", (spec.n_embd, 2 * d_inner + 2 * n_group * d_state + n_head), w),
        (blk + "ssm_conv1d.weight", (d_conv, conv_dim), f32),
        (blk + "ssm_conv1d.bias", (conv_dim,), f32),
        (blk + "ssm_dt.bias", (n_head,), f32),
        (blk + "ssm_a", (1, n_head), f32),
        (blk + "ssm_d", (1, n_head), f32),
        (blk + "ssm_norm.weight", (d_inner // n_group, n_group), f32),
        (blk + "ssm_out.weight", (d_inner, spec.n_embd), w),
        (blk + "ffn_norm.weight", (spec.n_embd,), f32),
        (blk + "ffn_gate.weight", (spec.n_embd, spec.n_ff), w),
        (blk + "ffn_up.weight", (spec.n_embd, spec.n_ff), w),
        (blk + "ffn_down.weight", (spec.n_ff, spec.n_embd), w),
    ]


def _qwen3next_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Qwen3-Next or Qwen3.5 block (llama.cpp's qwen3next.cpp / qwen35.cpp / qwen35moe.cpp
    load_block_trunk): gated delta net or gated attention, then experts with a shared expert
    (Qwen3.5 dense: one FFN). Blocks from n_layer on are multi-token-prediction blocks."""
    assert spec.gated_delta_net is not None
    d_conv, k_heads, v_heads, head, interval = spec.gated_delta_net
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    key_dim, value_dim = k_heads * head, v_heads * head
    qwen35 = spec.arch in ("qwen35", "qwen35moe")
    tensors = [(blk + "attn_norm.weight", (e,), f32), (blk + "post_attention_norm.weight", (e,), f32)]
    if (il + 1) % interval and il < spec.n_layer:
        # Qwen3.5 keeps the delta net's beta and alpha projections apart; Qwen3-Next fuses them.
        beta_alpha = (
            [(blk + "ssm_beta.weight", (e, v_heads), w), (blk + "ssm_alpha.weight", (e, v_heads), w)]
            if qwen35
            else [(blk + "ssm_ba.weight", (e, 2 * v_heads), w)]
        )
        tensors += [
            (blk + "attn_qkv.weight", (e, 2 * key_dim + value_dim), w),
            (blk + "attn_gate.weight", (e, value_dim), w),
            (blk + "ssm_conv1d.weight", (d_conv, 2 * key_dim + value_dim), f32),
            (blk + "ssm_dt.bias", (v_heads,), f32),
            (blk + "ssm_a", (v_heads,), f32),
            *beta_alpha,
            (blk + "ssm_norm.weight", (head,), f32),
            (blk + "ssm_out.weight", (value_dim, e), w),
        ]
    else:
        q_dim = spec.n_head * spec.head_dim
        tensors += [
            (blk + "attn_q.weight", (e, 2 * q_dim), w),
            (blk + "attn_k.weight", (e, spec.n_head_kv * spec.head_dim), w),
            (blk + "attn_v.weight", (e, spec.n_head_kv * spec.head_dim), w),
            (blk + "attn_output.weight", (q_dim, e), w),
            (blk + "attn_q_norm.weight", (spec.head_dim,), f32),
            (blk + "attn_k_norm.weight", (spec.head_dim,), f32),
        ]
    if il >= spec.n_layer:  # a multi-token-prediction block (qwen35.cpp load_block_mtp)
        tensors += [
            (blk + "nextn.eh_proj.weight", (2 * e, e), w),
            (blk + "nextn.enorm.weight", (e,), f32),
            (blk + "nextn.hnorm.weight", (e,), f32),
            (blk + "nextn.shared_head_norm.weight", (e,), f32),
        ]
    if spec.experts is None:  # Qwen3.5 dense
        return [
            *tensors,
            (blk + "ffn_gate.weight", (e, spec.n_ff), w),
            (blk + "ffn_up.weight", (e, spec.n_ff), w),
            (blk + "ffn_down.weight", (spec.n_ff, e), w),
        ]
    n_expert, _, n_ff_exp = spec.experts
    shared = n_ff_exp * spec.n_expert_shared
    return [
        *tensors,
        (blk + "ffn_gate_inp.weight", (e, n_expert), f32),
        (blk + "ffn_gate_exps.weight", (e, n_ff_exp, n_expert), w),
        (blk + "ffn_up_exps.weight", (e, n_ff_exp, n_expert), w),
        (blk + "ffn_down_exps.weight", (n_ff_exp, e, n_expert), w),
        (blk + "ffn_gate_inp_shexp.weight", (e,), f32),
        (blk + "ffn_gate_shexp.weight", (e, shared), w),
        (blk + "ffn_up_shexp.weight", (e, shared), w),
        (blk + "ffn_down_shexp.weight", (shared, e), w),
    ]


def _nemotron_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Nemotron-H block (llama.cpp's nemotron-h.cpp): a Mamba-2 mixer (d_inner = heads × 80
    here: the heads' size from the config), an up/down MLP, or attention — never two."""
    assert spec.mamba2 is not None and spec.nemotron_pattern is not None
    d_conv, d_state, n_group, n_head = spec.mamba2
    d_inner = n_head * 80
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    kind = spec.nemotron_pattern[il]
    tensors = [(blk + "attn_norm.weight", (e,), f32)]
    if kind == "M":
        conv_dim = d_inner + 2 * n_group * d_state
        return [
            *tensors,
            (blk + "ssm_in.weight", (e, 2 * d_inner + 2 * n_group * d_state + n_head), w),
            (blk + "ssm_conv1d.weight", (d_conv, conv_dim), f32),
            (blk + "ssm_conv1d.bias", (conv_dim,), f32),
            (blk + "ssm_dt.bias", (n_head,), f32),
            (blk + "ssm_a", (1, n_head), f32),
            (blk + "ssm_d", (1, n_head), f32),
            (blk + "ssm_norm.weight", (d_inner // n_group, n_group), f32),
            (blk + "ssm_out.weight", (d_inner, e), w),
        ]
    if kind == "-":
        return [*tensors, (blk + "ffn_up.weight", (e, spec.n_ff), w), (blk + "ffn_down.weight", (spec.n_ff, e), w)]
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    return [
        *tensors,
        (blk + "attn_q.weight", (e, q_dim), w),
        (blk + "attn_k.weight", (e, kv_dim), w),
        (blk + "attn_v.weight", (e, kv_dim), w),
        (blk + "attn_output.weight", (q_dim, e), w),
    ]


def _rwkv7_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """An RWKV-7 block (llama.cpp's rwkv7.cpp load_arch_tensors); LoRA matrices in F16."""
    assert spec.rwkv7 is not None
    _, decay, iclr, value_mix, gate = spec.rwkv7
    f32, f16, w, e, blk = Q.F32, Q.F16, spec.weight_type, spec.n_embd, f"blk.{il}."
    v_rank = iclr if il == 0 else value_mix
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]] = [
        (blk + name, (e,), f32) for name in ("attn_norm.weight", "attn_norm.bias", "attn_norm_2.weight", "attn_norm_2.bias")
    ]
    for prefix, rank in (("w", decay), ("a", iclr), ("v", v_rank)):
        tensors += [
            (f"{blk}time_mix_{prefix}0.weight", (e,), f32),
            (f"{blk}time_mix_{prefix}1.weight", (e, rank), f16),
            (f"{blk}time_mix_{prefix}2.weight", (rank, e), f16),
        ]
    return [
        *tensors,
        (blk + "time_mix_g1.weight", (e, gate), f16),
        (blk + "time_mix_g2.weight", (gate, e), f16),
        (blk + "time_mix_lerp_fused.weight", (e, 1, 1, 6), f32),
        (blk + "time_mix_k_k.weight", (e,), f32),
        (blk + "time_mix_k_a.weight", (e,), f32),
        (blk + "time_mix_r_k.weight", (e,), f32),
        (blk + "time_mix_key.weight", (e, e), w),
        (blk + "time_mix_value.weight", (e, e), w),
        (blk + "time_mix_receptance.weight", (e, e), w),
        (blk + "time_mix_ln.weight", (e,), f32),
        (blk + "time_mix_ln.bias", (e,), f32),
        (blk + "time_mix_output.weight", (e, e), w),
        (blk + "channel_mix_lerp_k.weight", (e, 1, 1), f32),
        (blk + "channel_mix_key.weight", (e, spec.n_ff), w),
        (blk + "channel_mix_value.weight", (spec.n_ff, e), w),
    ]


def _kda_block(spec: SparseArch, blk: str) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Kimi Delta Attention mixer (llama.cpp's kimi-linear.cpp, the is_recr branch)."""
    assert spec.kda is not None
    d_conv, head = spec.kda
    inner, f32, w, e = spec.n_head * head, Q.F32, spec.weight_type, spec.n_embd
    return [
        (blk + "attn_norm.weight", (e,), f32),
        (blk + "ssm_conv1d_q.weight", (d_conv, 1, inner), f32),
        (blk + "ssm_conv1d_k.weight", (d_conv, 1, inner), f32),
        (blk + "ssm_conv1d_v.weight", (d_conv, 1, inner), f32),
        (blk + "attn_q.weight", (e, inner), w),
        (blk + "attn_k.weight", (e, inner), w),
        (blk + "attn_v.weight", (e, inner), w),
        (blk + "ssm_f_a.weight", (e, head), Q.Q8_0),
        (blk + "ssm_f_b.weight", (head, inner), Q.Q8_0),
        (blk + "ssm_beta.weight", (e, spec.n_head), Q.Q8_0),
        (blk + "ssm_a", (1, spec.n_head), f32),
        (blk + "ssm_dt.bias", (inner,), f32),
        (blk + "ssm_g_a.weight", (e, head), Q.Q8_0),
        (blk + "ssm_g_b.weight", (head, inner), Q.Q8_0),
        (blk + "ssm_norm.weight", (head,), f32),
        (blk + "attn_output.weight", (inner, e), w),
        (blk + "ffn_norm.weight", (e,), f32),
    ]


def _kimi_k3_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """One Kimi K3 block (llama.cpp's kimi-k3.cpp load_arch_tensors)."""
    assert spec.kda is not None and spec.mla is not None and spec.kimi_k3 is not None and spec.experts is not None
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    d_conv, head = spec.kda
    kv_lora, nope, rope, v_dim = spec.mla
    q_lora, latent = spec.kimi_k3
    n_expert, _, n_ff_exp = spec.experts
    inner = spec.n_head * head
    tensors = [(blk + name, (e,), f32) for name in ("attn_norm.weight", "ffn_norm.weight", "attn_res_score.weight", "ffn_res_score.weight")]
    if spec.attention_layers is not None and il not in spec.attention_layers:
        tensors += [(blk + f"ssm_conv1d_{x}.weight", (d_conv, 1, inner), f32) for x in "qkv"]
        tensors += [(blk + f"attn_{x}.weight", (e, inner), w) for x in "qkv"]
        tensors += [
            (blk + "ssm_f_a.weight", (e, head), w),
            (blk + "ssm_f_b.weight", (head, inner), w),
            (blk + "ssm_beta.weight", (e, spec.n_head), w),
            (blk + "ssm_a", (spec.n_head,), f32),
            (blk + "ssm_dt.bias", (inner,), f32),
            (blk + "ssm_g.weight", (e, inner), w),
            (blk + "ssm_norm.weight", (head,), f32),
            (blk + "attn_output.weight", (inner, e), w),
        ]
    else:
        tensors += [
            (blk + "attn_q_a_norm.weight", (q_lora,), f32),
            (blk + "attn_kv_a_norm.weight", (kv_lora,), f32),
            (blk + "attn_q_a.weight", (e, q_lora), w),
            (blk + "attn_q_b.weight", (q_lora, spec.n_head * (nope + rope)), w),
            (blk + "attn_kv_a_mqa.weight", (e, kv_lora + rope), w),
            (blk + "attn_k_b.weight", (nope, kv_lora, spec.n_head), w),
            (blk + "attn_v_b.weight", (kv_lora, v_dim, spec.n_head), w),
            (blk + "attn_gate.weight", (e, spec.n_head * v_dim), w),
            (blk + "attn_output.weight", (spec.n_head * v_dim, e), w),
        ]
    if il < spec.dense_lead:
        return [
            *tensors,
            (blk + "ffn_gate.weight", (e, spec.n_ff), w),
            (blk + "ffn_up.weight", (e, spec.n_ff), w),
            (blk + "ffn_down.weight", (spec.n_ff, e), w),
        ]
    shared = n_ff_exp * spec.n_expert_shared
    return [
        *tensors,
        (blk + "ffn_gate_inp.weight", (e, n_expert), f32),
        (blk + "exp_probs_b.bias", (n_expert,), f32),
        (blk + "ffn_gate_exps.weight", (latent, n_ff_exp, n_expert), Q.MXFP4),
        (blk + "ffn_up_exps.weight", (latent, n_ff_exp, n_expert), Q.MXFP4),
        (blk + "ffn_down_exps.weight", (n_ff_exp, latent, n_expert), Q.MXFP4),
        (blk + "ffn_routed_down.weight", (e, latent), w),
        (blk + "ffn_routed_up.weight", (latent, e), w),
        (blk + "ffn_routed_norm.weight", (latent,), f32),
        (blk + "ffn_gate_shexp.weight", (e, shared), w),
        (blk + "ffn_up_shexp.weight", (e, shared), w),
        (blk + "ffn_down_shexp.weight", (shared, e), w),
    ]


def _gpt_oss_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A gpt-oss block (llama.cpp's openai-moe.cpp load_arch_tensors)."""
    assert spec.experts is not None
    n_expert, _, n_ff_exp = spec.experts
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    x = Q.MXFP4 if w == Q.Q8_0 else w  # as shipped: experts MXFP4 beside Q8_0
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    return [
        (blk + "attn_norm.weight", (e,), f32),
        (blk + "post_attention_norm.weight", (e,), f32),
        (blk + "attn_q.weight", (e, q_dim), w),
        (blk + "attn_k.weight", (e, kv_dim), w),
        (blk + "attn_v.weight", (e, kv_dim), w),
        (blk + "attn_q.bias", (q_dim,), f32),
        (blk + "attn_k.bias", (kv_dim,), f32),
        (blk + "attn_v.bias", (kv_dim,), f32),
        (blk + "attn_output.weight", (q_dim, e), w),
        (blk + "attn_output.bias", (e,), f32),
        (blk + "attn_sinks.weight", (spec.n_head,), f32),
        (blk + "ffn_gate_inp.weight", (e, n_expert), w),
        (blk + "ffn_gate_inp.bias", (n_expert,), f32),
        (blk + "ffn_gate_exps.weight", (e, n_ff_exp, n_expert), x),
        (blk + "ffn_down_exps.weight", (n_ff_exp, e, n_expert), x),
        (blk + "ffn_up_exps.weight", (e, n_ff_exp, n_expert), x),
        (blk + "ffn_gate_exps.bias", (n_ff_exp, n_expert), f32),
        (blk + "ffn_down_exps.bias", (e, n_expert), f32),
        (blk + "ffn_up_exps.bias", (n_ff_exp, n_expert), f32),
    ]


def _rwkv6_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """An RWKV-6 block (llama.cpp's rwkv6.cpp load_arch_tensors); LoRA matrices in F16."""
    assert spec.rwkv6 is not None
    head, mix, decay = spec.rwkv6
    f32, f16, w, e, blk = Q.F32, Q.F16, spec.weight_type, spec.n_embd, f"blk.{il}."
    return [
        *((blk + name, (e,), f32) for name in ("attn_norm.weight", "attn_norm.bias", "attn_norm_2.weight", "attn_norm_2.bias")),
        (blk + "time_mix_w1.weight", (e, mix * 5), f16),
        (blk + "time_mix_w2.weight", (mix, e, 5), f16),
        (blk + "time_mix_lerp_x.weight", (e, 1, 1), f32),
        (blk + "time_mix_lerp_fused.weight", (e, 1, 1, 5), f32),
        (blk + "time_mix_first.weight", (head, e // head), f32),
        (blk + "time_mix_decay.weight", (e,), f32),
        (blk + "time_mix_decay_w1.weight", (e, decay), f16),
        (blk + "time_mix_decay_w2.weight", (decay, e), f16),
        (blk + "time_mix_key.weight", (e, e), w),
        (blk + "time_mix_value.weight", (e, e), w),
        (blk + "time_mix_receptance.weight", (e, e), w),
        (blk + "time_mix_gate.weight", (e, e), w),
        (blk + "time_mix_ln.weight", (e,), f32),
        (blk + "time_mix_ln.bias", (e,), f32),
        (blk + "time_mix_output.weight", (e, e), w),
        (blk + "channel_mix_lerp_k.weight", (e, 1, 1), f32),
        (blk + "channel_mix_lerp_r.weight", (e, 1, 1), f32),
        (blk + "channel_mix_key.weight", (e, spec.n_ff), w),
        (blk + "channel_mix_value.weight", (spec.n_ff, e), w),
        (blk + "channel_mix_receptance.weight", (e, e), w),
    ]


def _jamba_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """One Jamba block (llama.cpp's jamba.cpp): a Mamba-1 mixer with normed dt, B and C, or
    attention; then experts or a dense FFN."""
    assert spec.mamba1 is not None and spec.attention_layers is not None and spec.experts is not None
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    kv_dim = spec.n_head_kv * spec.head_dim
    if il in spec.attention_layers:
        tensors = [
            (blk + "attn_norm.weight", (e,), f32),
            (blk + "attn_q.weight", (e, e), w),
            (blk + "attn_k.weight", (e, kv_dim), w),
            (blk + "attn_v.weight", (e, kv_dim), w),
            (blk + "attn_output.weight", (e, e), w),
        ]
    else:
        _, d_state, dt_rank = spec.mamba1
        tensors = [
            *_mamba1_block(spec, il),
            (blk + "ssm_dt_norm.weight", (dt_rank,), f32),
            (blk + "ssm_b_norm.weight", (d_state,), f32),
            (blk + "ssm_c_norm.weight", (d_state,), f32),
        ]
    tensors.append((blk + "ffn_norm.weight", (e,), f32))
    if spec.expert_layers is not None and il in spec.expert_layers:
        n_expert = spec.experts[0]
        return [
            *tensors,
            (blk + "ffn_gate_inp.weight", (e, n_expert), f32),
            (blk + "ffn_gate_exps.weight", (e, spec.n_ff, n_expert), w),
            (blk + "ffn_up_exps.weight", (e, spec.n_ff, n_expert), w),
            (blk + "ffn_down_exps.weight", (spec.n_ff, e, n_expert), w),
        ]
    return [
        *tensors,
        (blk + "ffn_gate.weight", (e, spec.n_ff), w),
        (blk + "ffn_up.weight", (e, spec.n_ff), w),
        (blk + "ffn_down.weight", (spec.n_ff, e), w),
    ]


def _falcon_h1_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Falcon-H1 block (llama.cpp's falcon-h1.cpp): mixer, attention and MLP together (its
    feed-forward norm is named without ".weight", as the loader asks for it)."""
    assert spec.falcon_h1 is not None
    d_conv, d_state, n_group, n_head, d_inner = spec.falcon_h1
    conv_dim = d_inner + 2 * n_group * d_state
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    return [
        (blk + "ssm_in.weight", (e, d_inner + conv_dim + n_head), w),
        (blk + "ssm_conv1d.weight", (d_conv, conv_dim), f32),
        (blk + "ssm_conv1d.bias", (conv_dim,), f32),
        (blk + "ssm_dt.bias", (n_head,), f32),
        (blk + "ssm_a", (1, n_head), f32),
        (blk + "ssm_d", (1, n_head), f32),
        (blk + "ssm_norm.weight", (d_inner // n_group, n_group), f32),
        (blk + "ssm_out.weight", (d_inner, e), w),
        (blk + "attn_q.weight", (e, q_dim), w),
        (blk + "attn_k.weight", (e, kv_dim), w),
        (blk + "attn_v.weight", (e, kv_dim), w),
        (blk + "attn_output.weight", (q_dim, e), w),
        (blk + "attn_norm.weight", (e,), f32),
        (blk + "ffn_norm", (e,), f32),
        (blk + "ffn_gate.weight", (e, spec.n_ff), w),
        (blk + "ffn_up.weight", (e, spec.n_ff), w),
        (blk + "ffn_down.weight", (spec.n_ff, e), w),
    ]


def _mamba1_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Mamba-1 block (llama.cpp's mamba.cpp load_arch_tensors)."""
    assert spec.mamba1 is not None
    d_conv, d_state, dt_rank = spec.mamba1
    d_inner, f32, w, e, blk = 2 * spec.n_embd, Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    return [
        (blk + "attn_norm.weight", (e,), f32),
        (blk + "ssm_in.weight", (e, 2 * d_inner), w),
        (blk + "ssm_conv1d.weight", (d_conv, d_inner), f32),
        (blk + "ssm_conv1d.bias", (d_inner,), f32),
        (blk + "ssm_x.weight", (d_inner, dt_rank + 2 * d_state), w),
        (blk + "ssm_dt.weight", (dt_rank, d_inner), Q.Q8_0),
        (blk + "ssm_dt.bias", (d_inner,), f32),
        (blk + "ssm_a", (d_state, d_inner), f32),
        (blk + "ssm_d", (d_inner,), f32),
        (blk + "ssm_out.weight", (d_inner, e), w),
    ]


def _gemma4_full(spec: SparseArch, il: int) -> bool:
    return spec.gemma4 is not None and (il + 1) % spec.gemma4[2] == 0


def _gemma4_block(spec: SparseArch, il: int) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A Gemma 4 block (llama.cpp's gemma4.cpp load_arch_tensors): attention with q/k norms and
    a post-norm, a layer output scale, a GELU FFN with its post-norm, and with experts a second
    FFN branch of routed experts (gate and up fused, as the converter writes them)."""
    assert spec.gemma4 is not None
    f32, w, e, blk = Q.F32, spec.weight_type, spec.n_embd, f"blk.{il}."
    full = _gemma4_full(spec, il)
    head, kv_heads = (spec.gemma4[0], spec.gemma4[1]) if full else (spec.head_dim, spec.n_head_kv)
    q_dim, kv_dim = spec.n_head * head, kv_heads * head
    tensors = [
        (blk + "attn_norm.weight", (e,), f32),
        (blk + "attn_q.weight", (e, q_dim), w),
        (blk + "attn_k.weight", (e, kv_dim), w),
        *([] if full and spec.gemma4[3] else [(blk + "attn_v.weight", (e, kv_dim), w)]),
        (blk + "attn_output.weight", (q_dim, e), w),
        (blk + "attn_q_norm.weight", (head,), f32),
        (blk + "attn_k_norm.weight", (head,), f32),
        (blk + "post_attention_norm.weight", (e,), f32),
        (blk + "layer_output_scale.weight", (1,), f32),
        (blk + "ffn_norm.weight", (e,), f32),
        (blk + "ffn_gate.weight", (e, spec.n_ff), w),
        (blk + "ffn_up.weight", (e, spec.n_ff), w),
        (blk + "ffn_down.weight", (spec.n_ff, e), _block_quant(w, (spec.n_ff,))),
        (blk + "post_ffw_norm.weight", (e,), f32),
    ]
    if spec.per_layer_embd:
        pl = spec.per_layer_embd
        tensors += [(blk + "inp_gate.weight", (e, pl), w), (blk + "proj.weight", (pl, e), w), (blk + "post_norm.weight", (e,), f32)]
    if spec.experts is None:
        return tensors
    n_expert, _, n_ff_exp = spec.experts
    return [
        *tensors,
        (blk + "ffn_gate_inp.weight", (e, n_expert), f32),
        (blk + "ffn_gate_inp.scale", (e,), f32),
        (blk + "pre_ffw_norm_2.weight", (e,), f32),
        (blk + "post_ffw_norm_1.weight", (e,), f32),
        (blk + "post_ffw_norm_2.weight", (e,), f32),
        (blk + "ffn_gate_up_exps.weight", (e, 2 * n_ff_exp, n_expert), w),
        (blk + "ffn_down_exps.weight", (n_ff_exp, e, n_expert), _block_quant(w, (n_ff_exp,))),
        (blk + "ffn_down_exps.scale", (n_expert,), f32),
    ]


def _attention(spec: SparseArch, blk: str) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """A standard attention block's projections and the norms its layout puts around them."""
    f32, w = Q.F32, spec.weight_type
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    if spec.fused_qkv:
        tensors = [(blk + "attn_qkv.weight", (spec.n_embd, q_dim + 2 * kv_dim), w)]
    else:
        tensors = [
            (blk + "attn_q.weight", (spec.n_embd, q_dim), w),
            (blk + "attn_k.weight", (spec.n_embd, kv_dim), w),
            (blk + "attn_v.weight", (spec.n_embd, kv_dim), w),
        ]
    if spec.qkv_bias:
        tensors += [(blk + "attn_q.bias", (q_dim,), f32), (blk + "attn_k.bias", (kv_dim,), f32), (blk + "attn_v.bias", (kv_dim,), f32)]
    tensors.append((blk + "attn_output.weight", (q_dim, spec.n_embd), w))
    norms = {
        "pre": ("attn_norm", "ffn_norm"),
        "post": ("post_attention_norm", "post_ffw_norm"),
        "seed": ("attn_norm", "post_attention_norm"),
    }[spec.norm_layout]
    first, second = ((blk + norm + ".weight", (spec.n_embd,), f32) for norm in norms)
    return [first, *tensors, second]


def _tensors(spec: SparseArch) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """(name, ggml shape ne0-first, type) for every tensor llama.cpp creates for the arch."""
    f32, w = Q.F32, spec.weight_type
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]] = [("token_embd.weight", (spec.n_embd, spec.n_vocab), w)]
    if spec.gemma4 is not None:  # the proportional rope's frequency factors, first in the converter's file
        tensors.insert(0, ("rope_freqs.weight", (spec.gemma4[0] // 2,), f32))
    if spec.rope_factors:  # Phi-3's LongRoPE: one table of each, before the blocks
        tensors += [(f"rope_factors_{kind}.weight", (spec.rope_factors,), f32) for kind in ("long", "short")]
    if spec.per_layer_embd:
        pl_all = spec.per_layer_embd * spec.n_layer
        tensors += [
            ("per_layer_token_embd.weight", (pl_all, spec.n_vocab), w),
            ("per_layer_model_proj.weight", (spec.n_embd, pl_all), w),
            ("per_layer_proj_norm.weight", (spec.per_layer_embd,), f32),
        ]
    for il in range(spec.n_layer + spec.mtp_layers):
        blk = f"blk.{il}."
        if spec.gemma4 is not None:
            tensors += _gemma4_block(spec, il)
            continue
        if spec.kimi_k3 is not None:
            tensors += _kimi_k3_block(spec, il)
            continue
        if spec.gpt_oss:
            tensors += _gpt_oss_block(spec, il)
            continue
        if spec.arch == "jamba":
            tensors += _jamba_block(spec, il)
            continue
        if spec.rwkv6 is not None:
            tensors += _rwkv6_block(spec, il)
            continue
        if spec.gated_delta_net is not None:
            tensors += _qwen3next_block(spec, il)
            continue
        if spec.nemotron_pattern is not None:
            tensors += _nemotron_block(spec, il)
            continue
        if spec.mamba1 is not None:
            tensors += _mamba1_block(spec, il)
            continue
        if spec.rwkv7 is not None:
            tensors += _rwkv7_block(spec, il)
            continue
        if spec.falcon_h1 is not None:
            tensors += _falcon_h1_block(spec, il)
            continue
        if spec.mamba2 is not None and spec.attention_layers is not None and il not in spec.attention_layers:
            tensors += _mamba2_block(spec, blk)
            continue
        if spec.conv_l_cache and spec.attention_layers is not None and il not in spec.attention_layers:
            tensors += [
                (blk + "attn_norm.weight", (spec.n_embd,), f32),
                (blk + "shortconv.conv.weight", (spec.conv_l_cache, spec.n_embd), f32),
                (blk + "shortconv.in_proj.weight", (spec.n_embd, 3 * spec.n_embd), w),
                (blk + "shortconv.out_proj.weight", (spec.n_embd, spec.n_embd), w),
                (blk + "ffn_norm.weight", (spec.n_embd,), f32),
                (blk + "ffn_gate.weight", (spec.n_embd, spec.n_ff), w),
                (blk + "ffn_up.weight", (spec.n_embd, spec.n_ff), w),
                (blk + "ffn_down.weight", (spec.n_ff, spec.n_embd), w),
            ]
            continue
        if spec.mla:
            is_kda = spec.kda is not None and spec.attention_layers is not None and il not in spec.attention_layers
            tensors += _kda_block(spec, blk) if is_kda else _mla_block(spec, blk)
            if il < spec.dense_lead:
                tensors += [
                    (blk + "ffn_gate.weight", (spec.n_embd, spec.n_ff), w),
                    (blk + "ffn_up.weight", (spec.n_embd, spec.n_ff), w),
                    (blk + "ffn_down.weight", (spec.n_ff, spec.n_embd), _block_quant(w, (spec.n_ff,))),
                ]
                continue
            assert spec.experts is not None
            n_expert, _, n_ff_exp = spec.experts
            shared = n_ff_exp * spec.n_expert_shared
            tensors += [
                (blk + "ffn_gate_inp.weight", (spec.n_embd, n_expert), f32),
                (blk + "ffn_gate_exps.weight", (spec.n_embd, n_ff_exp, n_expert), w),
                (blk + "ffn_up_exps.weight", (spec.n_embd, n_ff_exp, n_expert), w),
                (blk + "ffn_down_exps.weight", (n_ff_exp, spec.n_embd, n_expert), _block_quant(w, (n_ff_exp,))),
                (blk + "ffn_gate_shexp.weight", (spec.n_embd, shared), w),
                (blk + "ffn_up_shexp.weight", (spec.n_embd, shared), w),
                (blk + "ffn_down_shexp.weight", (shared, spec.n_embd), _block_quant(w, (shared,))),
            ]
            if spec.kda is not None:  # Kimi's router bias
                tensors.append((blk + "exp_probs_b.bias", (n_expert,), f32))
            continue
        tensors += _attention(spec, blk)
        if spec.qk_norm:
            q_norm, k_norm = (q_dim, kv_dim) if spec.qk_norm_full else (spec.head_dim, spec.head_dim)
            tensors += [(blk + "attn_q_norm.weight", (q_norm,), f32), (blk + "attn_k_norm.weight", (k_norm,), f32)]
        if spec.post_norms:
            tensors += [(blk + "post_attention_norm.weight", (spec.n_embd,), f32), (blk + "post_ffw_norm.weight", (spec.n_embd,), f32)]
        if spec.fused_qkv:
            tensors += [(blk + "ffn_up.weight", (spec.n_embd, 2 * spec.n_ff), w), (blk + "ffn_down.weight", (spec.n_ff, spec.n_embd), w)]
            continue
        if spec.experts:
            n_expert, _, n_ff_exp = spec.experts
            tensors += [
                (blk + "ffn_gate_inp.weight", (spec.n_embd, n_expert), f32),
                (blk + "ffn_gate_exps.weight", (spec.n_embd, n_ff_exp, n_expert), w),
                (blk + "ffn_up_exps.weight", (spec.n_embd, n_ff_exp, n_expert), w),
                (blk + "ffn_down_exps.weight", (n_ff_exp, spec.n_embd, n_expert), w),
            ]
        else:
            tensors += [
                (blk + "ffn_gate.weight", (spec.n_embd, spec.n_ff), w),
                (blk + "ffn_up.weight", (spec.n_embd, spec.n_ff), w),
                (blk + "ffn_down.weight", (spec.n_ff, spec.n_embd), w),
            ]
    if spec.rwkv7 is not None or spec.rwkv6 is not None:  # RWKV's embedding and output norms carry biases
        tensors += [
            (name, (spec.n_embd,), f32) for name in ("token_embd_norm.weight", "token_embd_norm.bias", "output_norm.weight", "output_norm.bias")
        ]
    else:
        tensors.append(("token_embd_norm.weight" if spec.arch == "lfm2" else "output_norm.weight", (spec.n_embd,), f32))
    if spec.kimi_k3 is not None:
        tensors.append(("output_res_score.weight", (spec.n_embd,), f32))
    if not spec.tied_output:
        tensors.append(("output.weight", (spec.n_embd, spec.n_vocab), spec.output_type))
    return tensors


def write_sparse_gguf(
    path: Path,
    spec: SparseArch,
    *,
    retype: Mapping[str, GGMLQuantizationType] | None = None,
    order: Sequence[str] | None = None,
    file_type: int | None = None,
) -> Path:
    """Write ``spec`` as a GGUF whose tensor data is a hole; returns ``path``.

    ``retype`` gives some tensors another type, ``order`` the tensors' order in the file, and
    ``file_type`` the general.file_type (with general.quantization_version 2), as
    llama-quantize would write them (tests/support/catalog_headers.py)."""
    writer = SparseWriter(path, spec.arch)
    a = spec.arch
    writer.add_string("general.name", spec.name)
    if file_type is not None:
        writer.add_uint32("general.quantization_version", 2)
        writer.add_uint32("general.file_type", file_type)
    writer.add_uint32(f"{a}.block_count", spec.n_layer + spec.mtp_layers)
    if spec.mtp_layers:
        writer.add_uint32(f"{a}.nextn_predict_layers", spec.mtp_layers)
    writer.add_uint32(f"{a}.context_length", spec.n_ctx_train)
    writer.add_uint32(f"{a}.embedding_length", spec.n_embd)
    if spec.nemotron_pattern is None:  # Nemotron-H: a per-block array, below
        writer.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", spec.n_head)
    if spec.rwkv7 is not None:
        head, decay, iclr, value_mix, gate = spec.rwkv7
        writer.add_uint32(f"{a}.wkv.head_size", head)
        for key, value in {"decay": decay, "iclr": iclr, "value_residual_mix": value_mix, "gate": gate}.items():
            writer.add_uint32(f"{a}.attention.{key}_lora_rank", value)
        writer.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-5)
        writer.add_uint32(f"{a}.token_shift_count", 2)
        writer.add_uint32(f"{a}.attention.head_count_kv", 0)
    elif spec.rwkv6 is not None:
        head, mix, decay = spec.rwkv6
        writer.add_uint32(f"{a}.wkv.head_size", head)
        writer.add_uint32(f"{a}.time_mix_extra_dim", mix)
        writer.add_uint32(f"{a}.time_decay_extra_dim", decay)
        writer.add_uint32(f"{a}.rescale_every_n_layers", 6)
        writer.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-5)
        writer.add_uint32(f"{a}.attention.head_count_kv", 0)
    elif spec.falcon_h1 is not None:
        d_conv, d_state, n_group, n_head, d_inner = spec.falcon_h1
        for key, value in {
            "conv_kernel": d_conv,
            "state_size": d_state,
            "group_count": n_group,
            "time_step_rank": n_head,
            "inner_size": d_inner,
        }.items():
            writer.add_uint32(f"{a}.ssm.{key}", value)
        writer.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    elif spec.arch == "jamba" and spec.mamba1 is not None and spec.attention_layers is not None:
        writer.add_array(f"{a}.attention.head_count_kv", [spec.n_head_kv if il in spec.attention_layers else 0 for il in range(spec.n_layer)])
        d_conv, d_state, dt_rank = spec.mamba1
        for key, value in {"conv_kernel": d_conv, "state_size": d_state, "time_step_rank": dt_rank, "inner_size": 2 * spec.n_embd}.items():
            writer.add_uint32(f"{a}.ssm.{key}", value)
    elif spec.mamba1 is not None:
        d_conv, d_state, dt_rank = spec.mamba1
        for key, value in {"conv_kernel": d_conv, "state_size": d_state, "time_step_rank": dt_rank, "inner_size": 2 * spec.n_embd}.items():
            writer.add_uint32(f"{a}.ssm.{key}", value)
        writer.add_uint32(f"{a}.attention.head_count_kv", 0)
    elif spec.nemotron_pattern is not None and spec.mamba2 is not None:
        pattern = spec.nemotron_pattern
        writer.add_array(f"{a}.attention.head_count_kv", [spec.n_head_kv if kind == "*" else 0 for kind in pattern])
        writer.add_array(f"{a}.feed_forward_length", [spec.n_ff if kind == "-" else 0 for kind in pattern])
        writer.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-5)
        d_conv, d_state, n_group, n_head = spec.mamba2
        for key, value in {
            "conv_kernel": d_conv,
            "state_size": d_state,
            "group_count": n_group,
            "time_step_rank": n_head,
            "inner_size": n_head * 80,
        }.items():
            writer.add_uint32(f"{a}.ssm.{key}", value)
    elif spec.attention_layers is not None:
        writer.add_array(f"{a}.attention.head_count_kv", [spec.n_head_kv if il in spec.attention_layers else 0 for il in range(spec.n_layer)])
        if spec.conv_l_cache:
            writer.add_uint32(f"{a}.shortconv.l_cache", spec.conv_l_cache)
        if spec.kda:
            writer.add_uint32(f"{a}.ssm.conv_kernel", spec.kda[0])
            writer.add_uint32(f"{a}.kda.head_dim", spec.kda[1])
            writer.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        if spec.mamba2:
            d_conv, d_state, n_group, n_head = spec.mamba2
            for key, value in {
                "conv_kernel": d_conv,
                "state_size": d_state,
                "group_count": n_group,
                "time_step_rank": n_head,
                "inner_size": 2 * spec.n_embd,
            }.items():
                writer.add_uint32(f"{a}.ssm.{key}", value)
    elif spec.gemma4 is not None:
        full_head, full_kv, _, _ = spec.gemma4
        writer.add_array(f"{a}.attention.head_count_kv", [full_kv if _gemma4_full(spec, il) else spec.n_head_kv for il in range(spec.n_layer)])
        writer.add_array(f"{a}.attention.sliding_window_pattern", [not _gemma4_full(spec, il) for il in range(spec.n_layer)])
        if f"{a}.attention.shared_kv_layers" not in spec.extra:  # else from extra: the last blocks reuse earlier caches
            writer.add_uint32(f"{a}.attention.shared_kv_layers", 0)
        writer.add_uint32(f"{a}.embedding_length_per_layer_input", spec.per_layer_embd)
        writer.add_uint32(f"{a}.attention.key_length_swa", spec.head_dim)
        writer.add_uint32(f"{a}.attention.value_length_swa", spec.head_dim)
        writer.add_uint32(f"{a}.rope.dimension_count", full_head)
        writer.add_uint32(f"{a}.rope.dimension_count_swa", spec.head_dim)
        writer.add_float32(f"{a}.rope.freq_base_swa", 10_000.0)
        writer.add_float32(f"{a}.final_logit_softcapping", 30.0)
    else:
        writer.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    if spec.mla:
        kv_lora, nope, rope, v_dim = spec.mla
        writer.add_uint32(f"{a}.attention.key_length", kv_lora + rope)  # the cached latent + rope part
        writer.add_uint32(f"{a}.attention.value_length", kv_lora)
        writer.add_uint32(f"{a}.attention.key_length_mla", nope + rope)
        writer.add_uint32(f"{a}.attention.value_length_mla", v_dim)
        writer.add_uint32(f"{a}.attention.kv_lora_rank", kv_lora)
        writer.add_uint32(f"{a}.rope.dimension_count", rope)
        writer.add_uint32(f"{a}.expert_shared_count", spec.n_expert_shared)
        writer.add_uint32(f"{a}.leading_dense_block_count", spec.dense_lead)
        writer.add_float32(f"{a}.expert_weights_scale", 1.0)
    else:
        head = spec.gemma4[0] if spec.gemma4 is not None else spec.head_dim  # Gemma 4: the full-attention size
        writer.add_uint32(f"{a}.attention.key_length", head)
        writer.add_uint32(f"{a}.attention.value_length", head)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if spec.sliding_window:
        writer.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
    if spec.gpt_oss:
        writer.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)
    writer.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    if spec.gated_delta_net:
        d_conv, k_heads, v_heads, head, interval = spec.gated_delta_net
        for key, value in {
            "conv_kernel": d_conv,
            "state_size": head,
            "group_count": k_heads,
            "time_step_rank": v_heads,
            "inner_size": v_heads * head,
        }.items():
            writer.add_uint32(f"{a}.ssm.{key}", value)
        writer.add_uint32(f"{a}.full_attention_interval", interval)
        writer.add_uint32(f"{a}.rope.dimension_count", spec.head_dim // 4)
        if spec.arch in ("qwen35", "qwen35moe"):  # interleaved M-RoPE: Qwen3.5's mrope_section
            writer.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
        writer.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.experts[2] * spec.n_expert_shared if spec.experts else 0)
    if spec.experts:
        n_expert, n_used, n_ff_exp = spec.experts
        writer.add_uint32(f"{a}.expert_count", n_expert)
        writer.add_uint32(f"{a}.expert_used_count", n_used)
        writer.add_uint32(f"{a}.expert_feed_forward_length", n_ff_exp)
    for key, value in spec.extra.items():
        if key.endswith("rope.freq_base"):
            continue
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)  # type: ignore[operator]
    add_placeholder_vocab(writer, spec.n_vocab, text=spec.text_vocab)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)
    tensors = [(name, shape, (retype or {}).get(name, qtype)) for name, shape, qtype in _tensors(spec)]
    if order is not None:
        position = {name: index for index, name in enumerate(order)}
        if set(position) != {name for name, _, _ in tensors}:
            raise ValueError(f"{spec.name}: the order names other tensors than the model has")
        tensors.sort(key=lambda tensor: position[tensor[0]])
    return finish_with_tensors(writer, path, tensors)


if __name__ == "__main__":  # write them for a look: python -m tests.support.sparse_models DIR
    import sys

    directory = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for model in (LLAMA3_8B, QWEN3_8B, QWEN3_30B_A3B, DEEPSEEK_V2_LITE, LFM2_1_2B):
        out = write_sparse_gguf(directory / f"{model.name}.gguf", model)
        print(out, os.stat(out).st_size, "bytes,", os.stat(out).st_blocks * 512, "on disk")

# --- the families the catalog grew by in 2026-12 (shapes from each model's config.json, the
# Hugging Face repo named; recipes/models.toml keeps the same figures with its source). ---
# Qwen2.5-7B-Instruct: 28 blocks of 3584, 28 heads and 4 KV heads of 128 with Q/K/V biases, FFN
# 18,944, vocabulary 152,064, untied output. Full depth.
QWEN25_7B = SparseArch("qwen2.5-7b-q4k", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 32768, qkv_bias=True)
# Phi-4-mini-instruct: 32 blocks of 3072, 24 heads and 8 KV heads of 128 in one fused QKV, a fused
# gate+up of 2 × 8192, vocabulary 200,064, tied embeddings; partial rotary 0.75 (96 of 128 dims)
# with LongRoPE factors (48 each); its 262,144 sliding window, which phi3.cpp turns off. Full depth.
PHI4_MINI = SparseArch(
    "phi-4-mini-q4k",
    "phi3",
    32,
    3072,
    24,
    8,
    128,
    8192,
    200064,
    131072,
    tied_output=True,
    fused_qkv=True,
    rope_factors=48,
    extra={"phi3.rope.dimension_count": 96, "phi3.attention.sliding_window": 262144},
)
# OLMo-2-1124-7B-Instruct: 32 blocks of 4096, 32 heads (no GQA) of 128, norms after attention and
# after the FFN only, q/k norms over all heads, FFN 11,008, vocabulary 100,352. First 8 blocks.
OLMO2_7B_8L = SparseArch(
    "olmo-2-7b-8-blocks-q4k",
    "olmo2",
    8,
    4096,
    32,
    32,
    128,
    11008,
    100352,
    4096,
    qk_norm=True,
    qk_norm_full=True,
    norm_layout="post",
)
# SmolLM3-3B: 36 blocks of 2048, 16 heads and 4 KV heads of 128 (every 4th block without RoPE:
# no tensor of its own), FFN 11,008, vocabulary 128,256, tied embeddings. Full depth.
SMOLLM3_3B = SparseArch("smollm3-3b-q4k", "smollm3", 36, 2048, 16, 4, 128, 11008, 128256, 65536, tied_output=True)
# Seed-OSS-36B-Instruct: 64 blocks of 5120, 80 heads and 8 KV heads of 128 with Q/K/V biases,
# attn_norm then post_attention_norm before the FFN of 27,648, vocabulary 155,136. First 4 blocks.
SEED_OSS_36B_4L = SparseArch(
    "seed-oss-36b-4-blocks-q4k",
    "seed_oss",
    4,
    5120,
    80,
    8,
    128,
    27648,
    155136,
    524288,
    qkv_bias=True,
    norm_layout="seed",
)
# EXAONE-4.0-1.2B: 30 blocks of 2048, 32 heads and 8 KV heads of 64 with head-wise q/k norms,
# norms after attention and FFN only, FFN 4096, vocabulary 102,400, tied embeddings, no sliding
# window. Full depth.
EXAONE4_1_2B = SparseArch(
    "exaone-4.0-1.2b-q4k",
    "exaone4",
    30,
    2048,
    32,
    8,
    64,
    4096,
    102400,
    65536,
    tied_output=True,
    qk_norm=True,
    norm_layout="post",
)
# EXAONE-4.0-32B: 64 blocks of 5120, 40 heads and 8 KV heads of 128, FFN 27,392, vocabulary
# 102,400; 3 of every 4 blocks see a 4,096-token window (exaone4.cpp does so only at 64 blocks, so
# the whole depth is written), the 4th attends globally. Q8_0 is not repacked on this CPU.
EXAONE4_32B = SparseArch(
    "exaone-4.0-32b-q8",
    "exaone4",
    64,
    5120,
    40,
    8,
    128,
    27392,
    102400,
    131072,
    qk_norm=True,
    norm_layout="post",
    sliding_window=4096,
    weight_type=Q.Q8_0,
    output_type=Q.Q8_0,
)
# Falcon-H1-34B-Instruct (its config.json): 72 blocks of 5120, attention of 20 heads and 4 KV heads
# of 128 beside a Mamba-2 mixer of 32 heads of 128 (d_ssm 4096, d_state 256, 2 groups, conv 4), an
# MLP of 21,504, vocabulary 261,120. The first 4 blocks: two groups, unlike the 1.5B's one.
FALCON_H1_34B_4L = SparseArch(
    "falcon-h1-34b-4-blocks-q4k",
    "falcon-h1",
    4,
    5120,
    20,
    4,
    128,
    21504,
    261120,
    262144,
    falcon_h1=(4, 256, 2, 32, 4096),
)
