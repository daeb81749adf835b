"""What a plan says beside its figures: a context past the one the model was trained for. Pure."""

from __future__ import annotations

from ..fit.estimate import RunEstimate

__all__ = ["context_note"]


def context_note(estimate: RunEstimate, n_ctx_train: int, ctx_asked: int) -> str | None:
    """What a context past the trained one means (``ctx_asked``: tokens per slot asked past it, 0: none): llama-server caps each slot at the trained
    context (``n_ctx_slot()`` in its tools/server/server-context.cpp) unless RoPE is stretched
    with YaRN, which raises the cap to ``--yarn-orig-ctx`` × ``--rope-scale`` (``llama_init_from_model``
    in src/llama-context.cpp); past the trained context answers may degrade either way."""
    if not n_ctx_train:
        return None
    params = estimate.params
    shared = estimate.request.kv_unified and params.n_seq_max > 1  # --users: --ctx per user, one cache of them all
    asked = ctx_asked or (params.n_ctx_padded // params.n_seq_max if shared else params.n_ctx_seq)
    if asked <= n_ctx_train:
        return None
    factor = asked / n_ctx_train
    stretch = f"-- --rope-scaling yarn --rope-scale {factor:.3g} --yarn-orig-ctx {n_ctx_train}"
    if ctx_asked:
        return (
            f"{asked:,} tokens per slot asked; the model was trained for {n_ctx_train:,} and llama-server caps each slot there, so "
            f"the cache is planned for {n_ctx_train:,} per slot (for {asked:,}, stretch RoPE: {stretch}; answers may degrade past "
            f"{n_ctx_train:,})"
        )
    return (
        f"{asked:,} tokens per slot is more than the {n_ctx_train:,} the model was trained for: llama-server caps each slot there "
        f"unless RoPE is stretched ({stretch}), and past it answers may degrade"
    )
