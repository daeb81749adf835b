"""The share of a layer's experts a batch of tokens reads (tierlocal/fit/routing.py), uniform and
with the routers' popularity skewed."""

from __future__ import annotations

import pytest

from tierlocal.fit.routing import ROUTING_SKEW, distinct_expert_share


def test_uniform_routing_is_one_minus_the_chance_no_token_picks_an_expert() -> None:
    assert distinct_expert_share(4 / 32, 1, 0.0) == pytest.approx(0.125)
    assert distinct_expert_share(4 / 32, 2, 0.0) == pytest.approx(1 - 0.875**2)
    assert distinct_expert_share(8 / 128, 16, 0.0) == pytest.approx(1 - (120 / 128) ** 16)
    assert distinct_expert_share(1.0, 7, 1.0) == 1.0  # a dense model reads everything


def _discrete_share(experts: int, used: int, tokens: int, alpha: float) -> float:
    """The same law over ``experts`` discrete experts (rank share (i + ½)/E), solved here by its
    own bisection: each expert picked with min(1, c·x^−α), the picks summing to ``used``."""
    ranks = [((i + 0.5) / experts) ** -alpha for i in range(experts)]
    low, high = 0.0, 1.0
    for _ in range(100):
        c = (low + high) / 2
        low, high = (low, c) if sum(min(1.0, c * r) for r in ranks) > used else (c, high)
    picks = [min(1.0, c * r) for r in ranks]
    return sum(1 - (1 - p) ** tokens for p in picks) / experts


@pytest.mark.parametrize(("experts", "used", "tokens", "alpha"), [(32, 4, 8, 0.9), (128, 4, 32, 1.0), (128, 8, 16, 1.5), (256, 8, 64, 0.5)])
def test_skewed_routing_matches_the_law_over_discrete_experts(experts: int, used: int, tokens: int, alpha: float) -> None:
    assert distinct_expert_share(used / experts, tokens, alpha) == pytest.approx(_discrete_share(experts, used, tokens, alpha), rel=0.03)


def test_skew_concentrates_a_batch_on_fewer_experts_and_still_reads_them_all_in_the_end() -> None:
    for tokens in (2, 4, 8, 16, 32):
        shares = [distinct_expert_share(4 / 128, tokens, alpha) for alpha in (0.0, 0.5, 1.0, 1.5)]
        assert shares == sorted(shares, reverse=True) and shares[-1] < shares[0]
    assert distinct_expert_share(4 / 128, 1, 1.5) == pytest.approx(4 / 128)
    growing = [distinct_expert_share(8 / 128, tokens, 1.0) for tokens in (1, 2, 8, 64, 512, 4096)]
    assert growing == sorted(growing) and growing[-1] > 0.99


def test_a_skew_admits_what_gb10_read_for_gpt_oss_120b_at_32_sequences() -> None:
    """recipes/batched_bench.toml: 353.31 tokens/s at B = 32 (PP 512) on GB10 is a 90.6 ms step; at
    273 GB/s that reads at most 24.7 GB, 40% of the 61.1 GB of gpt-oss-120b's experts (36 layers ×
    128 experts). Uniform routing says 32 tokens touch 64% of them; α = 1 fits under the bound."""
    read_bound = 32 / 353.31 * 273e9 / 61.07e9  # recipes/headers/gpt-oss-120b.MXFP4_MOE.json: its *_exps tensors
    assert distinct_expert_share(4 / 128, 32, 0.0) > read_bound > distinct_expert_share(4 / 128, 32, 1.0)
    assert distinct_expert_share(4 / 128, 32) < read_bound  # the skew the product prices with


def test_the_product_prices_with_routers_that_concentrate() -> None:
    """α is fitted on published batched decode (bench/concurrency_published.py); it is no longer uniform."""
    assert 0.5 <= ROUTING_SKEW <= 2.0
    assert distinct_expert_share(4 / 32, 8) < 1 - (28 / 32) ** 8
