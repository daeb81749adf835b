"""Many users on one llama-server: each user's decode speed, the throughput they add up to, and
their time to first token when N requests arrive together — priced with the single-stream
model's own device figures (:mod:`tierlocal.fit.speed`; one speed model, not a second). Pure.

llama-server batches continuously: every step puts the next token of each slot that is
generating into one batch, with prompt tokens of slots still reading theirs behind them, up to
``-b`` (2048) tokens a batch. A decode step of B sequences pays

- once, what one sequence's step pays (the weights read, the fixed costs per step and layer);
- per further sequence, its own work: one token's FLOPs through every matrix (the output layer
  included) at the device's prefill FLOP/s × :attr:`~.device_speed.DeviceSpeed.batch_flops_share`,
  its KV cache read at its depth, sampling over the vocabulary, and on a CPU a cost per matrix
  row of the types multiplied as a batch (:attr:`~.device_speed.DeviceSpeed.sequence_row_s`,
  timed by its calibration);
- for a mixture of experts, the experts B tokens route to: the expected share of a layer's
  experts that B tokens read (:func:`~.routing.distinct_expert_share`: k/E for one token, toward
  1 as B grows, slower than 1 − (1 − k/E)^B because routers favour some experts), so a step
  reads more of the weights as B grows — where the GPU's expert kernel groups the tokens routed
  to one expert; below the batch at which it starts to
  (:attr:`~.device_speed.DeviceSpeed.expert_grouped_from`: llama.cpp's Metal runs a mat-vec per
  token and expert below 32 tokens), each token reads its k experts itself. A grouped kernel
  that multiplies in tiles of T tokens (:attr:`~.device_speed.DeviceSpeed.expert_tile_tokens`:
  Metal's 32) runs a whole tile for each expert it reads, however few tokens that expert has:
  T × (experts read) − B·k rows of multiply-adds that no token needs, at the F16 prefill rate.

A batch with prompt tokens costs their prefill (the single-stream rate per prompt token, the
output layer once per prompt that ends in it) plus each decoding sequence's own work. The
first token of a request comes at the end of the batch its prompt's last token is in. Users
past the slots wait in line for one, as llama-server's queue does.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .cpu_kernels import CPU_ROW_COMPUTE_SHARE, CpuKernels
from .device_speed import DeviceSpeed
from .estimate import RunRequest
from .features import RunFeatures, expert_decode_features, run_features
from .model import ModelSpec
from .routing import ROUTING_SKEW, distinct_expert_share
from .speed import decode_seconds, prefill_seconds, priced_seconds

__all__ = [
    "BatchCosts",
    "UsersSpeed",
    "batch_costs",
    "users_speed",
    "users_table",
    "USER_COUNTS",
    "USERS_PROMPT",
    "USERS_TOKENS",
    "N_BATCH",
]

#: The user counts a plan's table shows.
USER_COUNTS = (1, 2, 4, 8, 16)
#: Prompt tokens of each user's request in the table (a short chat turn with a system prompt).
USERS_PROMPT = 256
#: Tokens each user's answer has (decode rate after the first token is over these).
USERS_TOKENS = 64
#: llama-server's logical batch (``-b``): prompt and decode tokens per step, at most.
N_BATCH = 2048


@dataclass(frozen=True)
class BatchCosts:
    """Seconds llama-server's batches cost on the planned devices (summed over devices).

    ``step_s``: one sequence's decode step, of which ``expert_read_s`` reads its experts
    (``used_share`` = k/E; 1: dense) and ``repacked_matvec_s`` multiplies the CPU's repacked
    weights. Each further sequence in a step adds ``sequence_s`` (its FLOPs where the weights'
    reads are shared, its KV read and sampling) and ``row_s`` (the compute share of a mat-vec the
    CPU runs row by row: the weights' chunk is already in cache). The repacked weights cost
    ``repacked_row_s`` a further row, or ``repacked_block_s`` per block of 4 rows (a mat-vec's
    read and four rows' FLOPs at the prefill rate), and ``repacked_token_s`` a row in a batch with a prompt. A prompt costs
    ``prompt_token_s`` a token and ``prompt_once_s`` once (the output layer)."""

    step_s: float
    sequence_s: float
    expert_read_s: float = 0.0
    used_share: float = 1.0
    prompt_token_s: float = 0.0
    prompt_once_s: float = 0.0
    row_s: float = 0.0
    repacked_matvec_s: float = 0.0
    repacked_row_s: float = 0.0
    repacked_block_s: float = 0.0
    repacked_token_s: float = 0.0
    #: The part of ``expert_read_s`` on a GPU that reads an expert once for all the tokens routed
    #: to it only from ``expert_grouped_from`` tokens on; below that, once per token.
    expert_read_ungrouped_s: float = 0.0
    expert_grouped_from: int = 1
    #: One token's k experts' multiply-adds at the F16 prefill rate on a GPU whose grouped expert
    #: kernel runs a whole tile of ``expert_tile_tokens`` rows for each expert it reads (0: none).
    expert_tile_s: float = 0.0
    expert_tile_tokens: int = 0
    #: α of the routers' expert popularity (:mod:`~.routing`).
    routing_skew: float = ROUTING_SKEW
    #: False when a device with prompt work has no prefill figure: decode is priced (each further
    #: sequence on it pays its own mat-vec), prompts and first tokens are not.
    prompts_priced: bool = True

    def decode_step_s(self, sequences: int) -> float:
        """One decode step of ``sequences`` sequences (seconds)."""
        if sequences <= 0:
            return 0.0
        distinct = distinct_expert_share(self.used_share, sequences, self.routing_skew)
        growth = distinct / self.used_share - 1.0 if self.used_share < 1.0 else 0.0
        blocks, rest = divmod(sequences, 4)
        if blocks:  # ggml's gemm on each block of 4 rows, its gemv on the rest (forward_mul_mat_one_chunk)
            repacked = blocks * self.repacked_block_s + rest * self.repacked_row_s - self.repacked_matvec_s
        else:
            repacked = (rest - 1) * self.repacked_row_s
        experts = self.expert_read_s * growth
        if sequences < self.expert_grouped_from and self.used_share < 1.0:  # each token reads its own experts there
            experts += self.expert_read_ungrouped_s * (sequences - 1 - growth)
        elif self.expert_tile_tokens and self.used_share < 1.0:  # the rows of each expert's tile no token fills
            experts += self.expert_tile_s * max(0.0, self.expert_tile_tokens * distinct / self.used_share - sequences)
        return self.step_s + (sequences - 1) * (self.sequence_s + self.row_s) + repacked + experts

    def batch_s(self, decoding: int, prompt_tokens: int, prompts_ending: int) -> float:
        """One batch of ``decoding`` generating sequences and ``prompt_tokens`` prompt tokens, of
        which ``prompts_ending`` prompts end in it (seconds)."""
        if prompt_tokens <= 0:
            return self.decode_step_s(decoding)
        further = self.sequence_s + self.row_s + self.repacked_token_s
        return prompt_tokens * self.prompt_token_s + prompts_ending * self.prompt_once_s + decoding * further


def _by_type(features: Mapping[str, float], kinds: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``features``' ``KIND:TYPE`` entries of ``kinds`` grouped by TYPE."""
    grouped: dict[str, dict[str, float]] = {}
    for name, amount in features.items():
        kind, _, ggml_type = name.partition(":")
        if kind in kinds:
            grouped.setdefault(ggml_type, {})[name] = amount
    return grouped


def _device_costs(run: RunFeatures, name: str, speed: DeviceSpeed, kernels: CpuKernels | None) -> dict[str, float]:
    """One device's share of :class:`BatchCosts`' fields (``kernels``: a CPU's; None: a GPU, whose
    further sequences cost their FLOPs at its prefill rate × its batch share)."""
    unused: set[str] = set()
    decode, prefill, once = run.decode[name], run.prefill[name], run.once[name]
    gemv, flops, output = _by_type(decode, ("bytes", "rows")), _by_type(prefill, ("flops", "xflops")), _by_type(once, ("flops", "xflops"))
    share = 1.0 if kernels is not None else max(speed.batch_flops_share, 1e-3)
    row_share = CPU_ROW_COMPUTE_SHARE if speed.batch_row_share is None else speed.batch_row_share
    costs = {"sequence_s": 0.0, "row_s": 0.0, "repacked_matvec_s": 0.0, "repacked_row_s": 0.0, "repacked_block_s": 0.0, "repacked_token_s": 0.0}
    for ggml_type in set(gemv) | set(flops) | set(output):
        matvec = decode_seconds(gemv.get(ggml_type, {}), speed, unused)
        kind = kernels.kind(ggml_type) if kernels is not None else "shared"
        if kind == "per-row":
            costs["row_s"] += row_share * matvec
            continue
        token = sum(priced_seconds(part.get(ggml_type, {}), speed.prefill_flops_per_s, "flops", speed, unused) for part in (flops, output))
        if kind == "repacked":
            costs["repacked_matvec_s"] += matvec
            costs["repacked_row_s"] += row_share * matvec
            costs["repacked_block_s"] += matvec + 4 * token  # the weights read as one row reads them, then four rows' FLOPs
            costs["repacked_token_s"] += token
        else:  # multiplied as a batch: its FLOPs, and a cost per row that short rows make felt
            costs["sequence_s"] += token / share + gemv.get(ggml_type, {}).get(f"rows:{ggml_type}", 0.0) * speed.sequence_row_s
    costs["sequence_s"] += prefill.get("elems", 0.0) * speed.prefill_element_s
    costs["sequence_s"] += decode.get("kv_bytes", 0.0) / speed.rate(speed.decode_bytes_per_s, "F16")[0]
    costs["sequence_s"] += decode.get("vocab", 0.0) * speed.vocab_overhead_s
    return costs


def _expert_flops(prefill: Mapping[str, float]) -> float:
    """One prompt token's FLOPs through its k experts (``xflops:TYPE`` features)."""
    return sum(amount for name, amount in prefill.items() if name.startswith("xflops:"))


def _has_flops(*features: Mapping[str, float]) -> bool:
    return any(name.partition(":")[0] in ("flops", "xflops") for part in features for name in part)


def batch_costs(
    spec: ModelSpec,
    request: RunRequest,
    devices: Mapping[str, DeviceSpeed | None],
    *,
    cpu: CpuKernels | None = None,
    prompt: int = USERS_PROMPT,
    depth: int | None = None,
    max_tensor_bytes: int | None = None,
) -> BatchCosts | None:
    """The batch costs of the run ``request`` plans (its layers on the GPU, its cache types) on
    ``devices`` (``host``, ``gpu``; the host's batch kernels ``cpu``, default: every type shares
    its reads), for prompts of ``prompt`` tokens and decoding at ``depth`` (default: the prompt
    and half an answer). None: a device with work has no figures, or a GPU's have no prefill figure; a host known by its
    bandwidth alone prices decode only (``prompts_priced`` False)."""
    ngl, n_cpu_moe = request.ngl or 0, request.n_cpu_moe or 0
    run = run_features(
        spec,
        ngl=ngl,
        n_cpu_moe=n_cpu_moe,
        max_tensor_bytes=max_tensor_bytes,
        depth=depth or prompt + USERS_TOKENS // 2,
        prompt=prompt,
        cache_type_k=request.cache_type_k,
        cache_type_v=request.cache_type_v,
        ubatch=request.n_ubatch,
    )
    experts = expert_decode_features(spec, ngl=ngl, n_cpu_moe=n_cpu_moe, max_tensor_bytes=max_tensor_bytes)
    totals = {"step_s": 0.0, "expert_read_s": 0.0, "expert_read_ungrouped_s": 0.0, "expert_tile_s": 0.0, "prompt_token_s": 0.0, "prompt_once_s": 0.0}
    grouped_from, tile = 1, 0
    unused: set[str] = set()
    priced = True
    for name, decode in run.decode.items():
        speed = devices.get(name)
        if not decode:
            continue
        unpriced = speed is not None and not speed.prefill_flops_per_s and _has_flops(run.prefill[name], run.once[name])
        if speed is None or (unpriced and name != "host"):
            return None
        totals["step_s"] += decode_seconds(decode, speed, unused)
        expert_read = decode_seconds(experts[name], speed, unused) if experts[name] else 0.0
        totals["expert_read_s"] += expert_read
        if name != "host" and speed.expert_grouped_from > 1 and expert_read:
            totals["expert_read_ungrouped_s"] += expert_read
            grouped_from = speed.expert_grouped_from
            if speed.expert_tile_tokens and speed.prefill_flops_per_s:
                tile = speed.expert_tile_tokens
                totals["expert_tile_s"] += _expert_flops(run.prefill[name]) / speed.rate(speed.prefill_flops_per_s, "F16")[0]
        kernels = (cpu or CpuKernels()) if name == "host" else None
        if unpriced:  # a host known by its bandwidth alone: each further sequence reads as one does
            priced, kernels = False, CpuKernels(shared=frozenset())
        else:
            totals["prompt_token_s"] += prefill_seconds(run.prefill[name], speed, unused)
            totals["prompt_once_s"] += prefill_seconds(run.once[name], speed, unused)
        for field_name, seconds in _device_costs(run, name, speed, kernels).items():
            totals[field_name] = totals.get(field_name, 0.0) + seconds
    used = spec.n_expert_used / spec.n_expert if spec.n_expert and spec.n_expert_used else 1.0
    return BatchCosts(used_share=used, prompts_priced=priced, expert_grouped_from=grouped_from, expert_tile_tokens=tile, **totals)


@dataclass(frozen=True)
class UsersSpeed:
    """``users`` requests arriving together at a server of ``slots`` slots: the median user's
    decode tokens/s after the first token, the tokens all of them are given per second (from the
    first first token to the last token: users who wait for a slot count), and the time to first token
    (seconds; median and 95th percentile; None: prompts not priced) for prompts of ``prompt_tokens``. ``basis`` as in
    :data:`tierlocal.fit.speed.BASES`."""

    users: int
    slots: int
    per_user_decode_tokens_per_s: float
    aggregate_decode_tokens_per_s: float
    first_token_p50_s: float | None
    first_token_p95_s: float | None
    prompt_tokens: int
    basis: str = "derived"
    queued: int = field(default=0)

    @classmethod
    def from_json(cls, row: object) -> UsersSpeed | None:
        """A row :meth:`to_json` wrote (a serve's state file, a record); None: not such a row."""
        if not isinstance(row, dict):
            return None
        try:
            p50, p95 = row.get("first_token_p50_s"), row.get("first_token_p95_s")
            return cls(
                int(row["users"]),
                int(row["slots"]),
                float(row["per_user_decode_tokens_per_s"]),
                float(row["aggregate_decode_tokens_per_s"]),
                None if p50 is None else float(p50),
                None if p95 is None else float(p95),
                int(row["prompt_tokens"]),
                str(row.get("basis", "derived")),
                int(row.get("queued") or 0),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> dict[str, object]:
        return {
            "users": self.users,
            "slots": self.slots,
            "queued": self.queued,
            "per_user_decode_tokens_per_s": round(self.per_user_decode_tokens_per_s, 2),
            "aggregate_decode_tokens_per_s": round(self.aggregate_decode_tokens_per_s, 2),
            "first_token_p50_s": None if self.first_token_p50_s is None else round(self.first_token_p50_s, 3),
            "first_token_p95_s": None if self.first_token_p95_s is None else round(self.first_token_p95_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "basis": self.basis,
        }


@dataclass
class _Request:
    index: int
    prompt_left: int
    tokens_left: int
    first_s: float | None = None
    last_s: float | None = None


def _simulate(costs: BatchCosts, users: int, slots: int, prompt: int, tokens: int, n_batch: int) -> list[_Request]:
    """llama-server's continuous batching of ``users`` requests arriving together (each
    ``prompt`` tokens in, ``tokens`` out) on ``slots`` slots; each request's first and last token times."""
    waiting = [_Request(index, prompt, tokens) for index in range(users)]
    active: list[_Request] = []
    done: list[_Request] = []
    clock = 0.0
    while waiting or active:
        while waiting and len(active) < slots:
            active.append(waiting.pop(0))
        decoding = [request for request in active if request.prompt_left == 0]
        room = max(n_batch - len(decoding), 1)
        prompt_tokens = ending = 0
        reading = []
        for request in active:
            if request.prompt_left and room > 0:
                take = min(request.prompt_left, room)
                room -= take
                prompt_tokens += take
                request.prompt_left -= take
                reading.append(request)
                ending += request.prompt_left == 0
        clock += costs.batch_s(len(decoding), prompt_tokens, ending)
        for request in decoding + [request for request in reading if request.prompt_left == 0]:
            request.first_s = clock if request.first_s is None else request.first_s
            request.last_s = clock
            request.tokens_left -= 1
        for request in [request for request in active if request.tokens_left <= 0]:
            active.remove(request)
            done.append(request)
    return done


def users_speed(
    costs: BatchCosts,
    users: int,
    slots: int,
    *,
    prompt: int = USERS_PROMPT,
    tokens: int = USERS_TOKENS,
    n_batch: int = N_BATCH,
    basis: str = "derived",
) -> UsersSpeed:
    """What ``users`` requests arriving together get from ``slots`` slots (:func:`_simulate`)."""
    done = _simulate(costs, users, max(slots, 1), prompt, max(tokens, 2), n_batch)
    rates = [(tokens - 1) / (r.last_s - r.first_s) for r in done if r.first_s is not None and r.last_s is not None and r.last_s > r.first_s]
    first = sorted(r.first_s or 0.0 for r in done)
    p95 = first[min(len(first) - 1, max(0, round(0.95 * len(first) + 0.4999) - 1))]
    rate = statistics.median(rates) if rates else 0.0
    p50 = statistics.median(first) if costs.prompts_priced else None
    return UsersSpeed(users, slots, rate, _throughput(done, tokens), p50, p95 if costs.prompts_priced else None, prompt, basis, max(users - slots, 0))


def _throughput(done: Sequence[_Request], tokens: int) -> float:
    """Tokens after each request's first, per second from the earliest first token to the latest last one."""
    span = max(r.last_s or 0.0 for r in done) - min(r.first_s or 0.0 for r in done)
    return len(done) * (tokens - 1) / span if span > 0 else 0.0


def users_table(
    costs: BatchCosts,
    slots: int,
    *,
    counts: Sequence[int] = USER_COUNTS,
    prompt: int = USERS_PROMPT,
    tokens: int = USERS_TOKENS,
    basis: str = "derived",
) -> tuple[UsersSpeed, ...]:
    """:func:`users_speed` for each of ``counts`` users on ``slots`` slots."""
    return tuple(users_speed(costs, users, slots, prompt=prompt, tokens=tokens, basis=basis) for users in counts)
