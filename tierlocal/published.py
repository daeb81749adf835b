"""Plain records of published facts, as the catalog loads them from recipes/ and the estimators
take them: llama-bench rows and their models' shapes, GPU datasheet figures, weight formats,
API prices, published cluster configurations. Pure data, below both the catalog (which fills
them) and the arithmetic that reads them (:mod:`tierlocal.fit.gpu_speed`,
:mod:`tierlocal.tiers.arithmetic`), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AnswerLength",
    "AnswerLengths",
    "RentalOffer",
    "ModelShape",
    "PublishedRow",
    "CardInfo",
    "Precision",
    "ApiPrices",
    "PublishedConfig",
    "QualityFigure",
    "QuantLoss",
    "ModeRule",
    "ModeWords",
    "VersionRule",
    "QualityRules",
    "weights_bytes",
    "HALF_TYPES",
    "LICENCE_USES",
    "LicenceTerms",
    "CpuBenchRow",
]

#: Weight types read at the half-precision rate (κ of :mod:`tierlocal.fit.gpu_speed`).
HALF_TYPES = ("F16", "BF16")


#: What a licence lets a business do with the weights, most permissive first.
LICENCE_USES = ("open", "conditions", "non-commercial")


@dataclass(frozen=True)
class LicenceTerms:
    """A model licence as its text reads (recipes/licences.toml): ``use`` one of
    :data:`LICENCE_USES`; ``summary`` the restriction a business meets; ``read`` False where the
    text itself could not be read and the class rests on the publisher's card."""

    id: str
    name: str
    use: str
    summary: str
    source: str
    date: str
    read: bool

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "use": self.use,
            "summary": self.summary,
            "source": self.source,
            "date": self.date,
            "read": self.read,
        }


@dataclass(frozen=True)
class ModelShape:
    """A published row's model: parameters (all, active per token) and the token embedding's."""

    name: str
    params: int
    active_params: int
    embedding_params: int
    #: Bytes a token reads in a file of ``read_file_bytes``, from its tensor table, where the
    #: share of the active parameters would miss it (a mixture with experts in one precision
    #: and attention in another); 0: use the share.
    read_bytes_per_token: int = 0
    read_file_bytes: int = 0
    #: Transformer blocks (config.json's num_hidden_layers); 0: not stated.
    n_layer: int = 0

    def read_bytes(self, file_bytes: int) -> float:
        """Weight bytes one generated token reads in a file of ``file_bytes``: the file's share of
        the active parameters, less the token embedding (a row lookup)."""
        if self.read_bytes_per_token and self.read_file_bytes:
            return self.read_bytes_per_token * file_bytes / self.read_file_bytes
        return file_bytes * (self.active_params - self.embedding_params) / self.params

    @property
    def prompt_flops(self) -> float:
        """FLOPs per prompt token: 2 × the active parameters it multiplies."""
        return 2.0 * (self.active_params - self.embedding_params)


@dataclass(frozen=True)
class CpuBenchRow:
    """One published llama-bench run on a CPU alone (recipes/cpu_speed.toml): ``threads`` (its
    -t), the vendor (``amd``, ``intel``) and instruction set (``avx512``, ``avx2``), the server's measured memory
    bandwidth (bytes/s), the model file's size (bytes), and prefill (pp512) and decode (tg128)
    tokens/s."""

    cpu: str
    vendor: str
    isa: str
    threads: int
    bandwidth_bytes_per_s: float
    shape: ModelShape
    size_bytes: int
    pp512: float
    tg128: float
    use: str
    source: str
    date: str

    @property
    def decode_bytes_per_s(self) -> float:
        """Weight bytes decode streamed per second."""
        return self.tg128 * self.shape.read_bytes(self.size_bytes)

    @property
    def prefill_flops_per_s(self) -> float:
        """Matrix FLOPs prefill did per second."""
        return self.pp512 * self.shape.prompt_flops


@dataclass(frozen=True)
class PublishedRow:
    """One llama-bench result: ``test`` is ``tg128``/``tg512`` (decode) or ``pp512`` (prefill)."""

    gpu: str
    shape: ModelShape
    model: str
    size_bytes: int
    test: str
    tokens_per_s: float
    use: str
    source: str
    date: str

    @property
    def half(self) -> bool:
        """Half-precision weights (F16/BF16) rather than a quantisation."""
        return any(name in self.model.upper() for name in HALF_TYPES)

    @property
    def read_bytes(self) -> float:
        """Weight bytes one generated token reads (:meth:`ModelShape.read_bytes`)."""
        return self.shape.read_bytes(self.size_bytes)

    @property
    def flops(self) -> float:
        """FLOPs per prompt token (:attr:`ModelShape.prompt_flops`)."""
        return self.shape.prompt_flops


@dataclass(frozen=True)
class CardInfo:
    """What the datasheet says (recipes/gpus.toml): bandwidth (bytes/s), FP16 FLOP/s (None: not
    published) and the groups a card without rows borrows from (architecture, backend)."""

    name: str
    bandwidth_bytes_per_s: int
    fp16_flops: float | None
    architecture: str
    backend: str


@dataclass(frozen=True)
class Precision:
    """A weight format: nominal bytes per weight, plus block-scale bytes per weight (MXFP4)."""

    name: str
    bytes_per_weight: float
    block_scale_bytes_per_weight: float = 0.0


@dataclass(frozen=True)
class ApiPrices:
    """A hosted API's prices in USD per million tokens."""

    #: USD per million prompt tokens the API serves from its prompt cache.
    input_cache_hit: float
    #: USD per million prompt tokens it does not (what a budget reserves the prompt at).
    input_cache_miss: float
    #: USD per million completion tokens.
    output: float


@dataclass(frozen=True)
class PublishedConfig:
    """A cluster configuration published for a model (memory in bytes)."""

    label: str
    gpu: str
    count: int
    memory_bytes: int


def weights_bytes(params: int, precision: Precision, *, with_scales: bool = False) -> int:
    """Parameters × bytes per weight (plus block scales when ``with_scales``), in bytes."""
    per_weight = precision.bytes_per_weight + (precision.block_scale_bytes_per_weight if with_scales else 0.0)
    return round(params * per_weight)


@dataclass(frozen=True)
class QualityFigure:
    """One published benchmark result (recipes/quality.toml): ``score`` on ``benchmark`` in
    ``mode`` (``thinking``: a reasoning trace first; ``standard``: answered directly), higher
    is better, as ``source`` gave it on ``date``; ``setting`` is the source's own words (shots,
    version), ``self_reported`` whether the publisher measured its own model, ``independent``
    whether an evaluator that publishes no model of its own did (a leaderboard, an evaluation suite:
    a publisher's table of a rival's results is neither, recipes/quality.toml ``[[publisher_pages]]``)."""

    model: str
    benchmark: str
    mode: str
    score: float
    setting: str
    self_reported: bool
    source: str
    date: str
    #: A reasoning effort the source ran the model at (``low``, ``medium``), where the model has
    #: such levels and this is not the one its other thinking figures are at (gpt-oss: ``high``,
    #: recipes/models.toml ``reasoning_effort``); None: that one.
    effort: str | None = None
    independent: bool = False

    @property
    def column(self) -> str:
        """The benchmark as scored: results in different modes are different tests."""
        return f"{self.benchmark} ({self.mode})"

    @property
    def variant(self) -> str:
        """The mode the model was run in as a candidate: ``thinking``, ``standard``, or thinking
        at an effort (``thinking-low``); its figures sit in the mode's columns all the same."""
        return f"{self.mode}-{self.effort}" if self.effort else self.mode

    def to_json(self) -> dict[str, object]:
        return {
            "benchmark": self.benchmark,
            "mode": self.mode,
            "score": self.score,
            "setting": self.setting,
            "self_reported": self.self_reported,
            "independent": self.independent,
            "source": self.source,
            "date": self.date,
            "effort": self.effort,
        }


@dataclass(frozen=True)
class QuantLoss:
    """A quantisation's measured loss against the 16-bit model: ``ppl_increase`` is the
    relative perplexity increase (0.03: 3% higher), ``mean_kld`` the mean KL-divergence where
    published (None: not in the source), measured on ``measured_on``."""

    quant: str
    ppl_increase: float
    mean_kld: float | None
    measured_on: str
    source: str
    date: str

    def to_json(self) -> dict[str, object]:
        return {
            "quant": self.quant,
            "ppl_increase": self.ppl_increase,
            "mean_kld": self.mean_kld,
            "measured_on": self.measured_on,
            "source": self.source,
            "date": self.date,
        }


@dataclass(frozen=True)
class ModeRule:
    """recipes/quality.toml ``[[mode_rule]]``: the modes the figures of the models ``models``
    (shell patterns: ``gemma-3-*``) may be recorded in, and why (the model's design, or what its
    card's tables run); with ``sources`` (prefixes of a figure's source), only the figures from
    those sources."""

    models: tuple[str, ...]
    modes: tuple[str, ...]
    why: str
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModeWords:
    """recipes/quality.toml ``[[mode_words]]``: the words (lower case) a figure's ``setting``
    uses for ``mode``; ``unstated`` words say the source does not tell."""

    mode: str
    words: tuple[str, ...]


@dataclass(frozen=True)
class VersionRule:
    """recipes/quality.toml ``[[version_rule]]``: ``benchmark``, one version of the benchmarks
    whose names start with ``family``, kept apart from the others; ``pattern`` (a regular
    expression) is how a setting names it."""

    family: str
    benchmark: str
    pattern: str


@dataclass(frozen=True)
class QualityRules:
    """The rules recipes/quality.toml states for its figures (:mod:`tierlocal.plan.quality_rules` checks them)."""

    modes: tuple[ModeRule, ...] = ()
    words: tuple[ModeWords, ...] = ()
    versions: tuple[VersionRule, ...] = ()
    #: Where model publishers print their tables (URL prefixes): a figure from one of them is
    #: a publisher's claim, of its own model or of a rival's, never an independent evaluation.
    publisher_pages: tuple[str, ...] = ()


@dataclass(frozen=True)
class RentalOffer:
    """One published rental offer of a card: USD per GPU-hour, billing (``on-demand``,
    ``spot``, ``community``), provider, date and source."""

    card: str
    usd_per_gpu_hour: float
    billing: str
    provider: str
    date: str
    source: str


@dataclass(frozen=True)
class AnswerLength:
    """recipes/answer_tokens.toml: the output tokens ``model`` spends per question in ``mode``
    (``thinking``: its reasoning trace and answer; ``standard``: the answer), as ``source``
    measured on ``workload`` (``date``); ``reasoning_tokens`` of them before the answer where
    the source splits them (None: not split)."""

    model: str
    mode: str
    tokens_per_answer: float
    reasoning_tokens: float | None
    workload: str
    source: str
    date: str


@dataclass(frozen=True)
class AnswerLengths:
    """recipes/answer_tokens.toml: every measurement, the workload a reasoning trace is priced on
    (``reference_workload``, and ``why`` that one), and the typical answer itself
    (``answer_tokens`` per answer to a real prompt, as ``answer_source`` measured it)."""

    reference_workload: str
    why: str
    lengths: tuple[AnswerLength, ...]
    answer_tokens: float
    answer_source: str
