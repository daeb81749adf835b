"""A plan as Ollama takes it: the model's ``num_gpu`` and ``num_ctx`` (per slot), and the
server-wide settings that only a server started with them can honour. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..fit.estimate import RunEstimate

__all__ = ["OllamaSettings", "ollama_settings"]


@dataclass(frozen=True)
class OllamaSettings:
    """``num_gpu`` layers on the GPU and ``num_ctx`` tokens per slot (model parameters), the
    ``OLLAMA_*`` server environment, and a note when the plan uses what Ollama lacks."""

    num_gpu: int
    num_ctx: int
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {"num_gpu": self.num_gpu, "num_ctx": self.num_ctx, "env": dict(self.env)}
        if self.note is not None:
            payload["note"] = self.note
        return payload


def ollama_settings(estimate: RunEstimate) -> OllamaSettings:
    """Ollama's settings for a planned run."""
    params, request = estimate.params, estimate.request
    env = {
        "OLLAMA_NUM_PARALLEL": str(params.n_seq_max),
        "OLLAMA_CONTEXT_LENGTH": str(params.n_ctx_seq),
        # Waiting requests beyond this get 503 at once (Ollama's default, 512, queues for minutes).
        "OLLAMA_MAX_QUEUE": str(max(8, 4 * params.n_seq_max)),
        "OLLAMA_FLASH_ATTENTION": "1" if request.flash_attn else "0",
    }
    if request.cache_type_k != "f16":
        env["OLLAMA_KV_CACHE_TYPE"] = request.cache_type_k
    note = "Ollama has no --n-cpu-moe; it would offload whole layers instead" if request.n_cpu_moe else None
    return OllamaSettings(request.ngl or 0, params.n_ctx_seq, env, note)
