"""Aggregation of the per-token KL term (docs/design.md §4), checked against explicit per-loss-type loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_kl.kl.aggregation import LOSS_TYPES, aggregate_like_host, length_normalized_mean, sequence_means


SETTINGS = settings(max_examples=60, deadline=None)

# Four sequences of lengths 5, 2, 0 (fully masked) and 3, with right padding and one gap inside the last row.
VALUES = [
    [0.3, 1.2, 0.0, 2.5, 0.7, 9.0],
    [4.0, 0.1, 7.0, 7.0, 7.0, 7.0],
    [5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
    [0.2, 8.0, 0.6, 0.0, 1.1, 3.0],
]
MASK = [
    [1, 1, 1, 1, 1, 0],
    [1, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 1, 0],
]
MAX_COMPLETION_LENGTH = 6
TOKEN_NORMALIZER = 7.5


def _seq_sum(row, mask_row):
    total = 0.0
    for x, m in zip(row, mask_row):
        total += m * x
    return total


def reference_aggregate(values, mask, loss_type, *, accumulation_steps, max_completion_length, token_normalizer):
    """docs/design.md §4, written per loss type with explicit loops over sequences and tokens."""
    num_seqs = len(values)
    sums = [_seq_sum(row, m) for row, m in zip(values, mask)]
    lengths = [sum(m) for m in mask]
    if loss_type in ("grpo", "sapo"):  # mean over sequences of per-sequence token means
        seq_means = [s / n if n > 0 else 0.0 for s, n in zip(sums, lengths)]
        return sum(seq_means) / num_seqs / accumulation_steps
    if loss_type == "bnpo":  # token mean over the micro-batch
        return sum(sums) / max(sum(lengths), 1) / accumulation_steps
    if loss_type == "dr_grpo":  # token sum / (B · max_completion_length)
        return sum(sums) / (num_seqs * max_completion_length) / accumulation_steps
    if loss_type in ("dapo", "cispo", "vespo"):  # token sum / (global token count, already rescaled)
        return sum(sums) / token_normalizer
    if loss_type == "luspo":  # per-sequence token sums averaged
        return sum(sums) / num_seqs / accumulation_steps
    raise AssertionError(f"no reference for {loss_type}")


def reference_token_weights(mask, loss_type, *, accumulation_steps, max_completion_length, token_normalizer):
    """∂Agg/∂x_it: every aggregate is linear, so its gradient is a per-token weight (0 on padding)."""
    num_seqs, total_tokens = len(mask), max(sum(map(sum, mask)), 1)
    weights = []
    for m in mask:
        length = sum(m)
        if loss_type in ("grpo", "sapo"):
            w = 1.0 / (max(length, 1) * num_seqs * accumulation_steps)
        elif loss_type == "bnpo":
            w = 1.0 / (total_tokens * accumulation_steps)
        elif loss_type == "dr_grpo":
            w = 1.0 / (num_seqs * max_completion_length * accumulation_steps)
        elif loss_type in ("dapo", "cispo", "vespo"):
            w = 1.0 / token_normalizer
        else:  # luspo
            w = 1.0 / (num_seqs * accumulation_steps)
        weights.append([w * mi for mi in m])
    return weights


KWARGS = dict(max_completion_length=MAX_COMPLETION_LENGTH, token_normalizer=TOKEN_NORMALIZER)


def test_loss_types_are_those_of_the_design():
    assert set(LOSS_TYPES) == {"grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo", "vespo", "luspo"}


@pytest.mark.parametrize("accumulation_steps", [1.0, 4.0])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregate_matches_host_formula(loss_type, accumulation_steps):
    values = torch.tensor(VALUES, dtype=torch.float64)
    got = aggregate_like_host(
        values, torch.tensor(MASK, dtype=torch.float64), loss_type, accumulation_steps=accumulation_steps, **KWARGS
    )
    expected = reference_aggregate(VALUES, MASK, loss_type, accumulation_steps=accumulation_steps, **KWARGS)
    assert got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregate_gradient_is_per_token_host_weight(loss_type):
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(MASK, dtype=torch.float64)
    out = aggregate_like_host(values, mask, loss_type, accumulation_steps=3.0, **KWARGS)
    (grad,) = torch.autograd.grad(out, values)
    expected = reference_token_weights(MASK, loss_type, accumulation_steps=3.0, **KWARGS)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregate_accepts_integer_and_bool_masks(loss_type):
    """TRL's completion mask is an integer tensor; the result must not depend on the mask's dtype."""
    values = torch.tensor(VALUES, dtype=torch.float64)
    expected = reference_aggregate(VALUES, MASK, loss_type, accumulation_steps=2.0, **KWARGS)
    for mask in (torch.tensor(MASK), torch.tensor(MASK).bool()):
        got = aggregate_like_host(values, mask, loss_type, accumulation_steps=2.0, **KWARGS)
        assert got.item() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_token_sum_types_use_only_the_token_normalizer(loss_type):
    """Their normalizer already contains the accumulation factor; a tensor normalizer works like a float."""
    values, mask = torch.tensor(VALUES, dtype=torch.float64), torch.tensor(MASK, dtype=torch.float64)
    expected = sum(_seq_sum(r, m) for r, m in zip(VALUES, MASK)) / 12.0
    for accumulation_steps in (1.0, 8.0):
        for normalizer in (12.0, torch.tensor(12.0, dtype=torch.float64)):
            got = aggregate_like_host(
                values, mask, loss_type, accumulation_steps=accumulation_steps, token_normalizer=normalizer
            )
            assert got.item() == pytest.approx(expected, rel=1e-14)


def test_dr_grpo_requires_max_completion_length():
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate_like_host(torch.ones(2, 3), torch.ones(2, 3), "dr_grpo")


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_token_sum_types_require_token_normalizer(loss_type):
    with pytest.raises(ValueError, match="token_normalizer"):
        aggregate_like_host(torch.ones(2, 3), torch.ones(2, 3), loss_type)


def test_unknown_loss_type_raises_naming_the_field():
    with pytest.raises(ValueError, match="loss_type") as info:
        aggregate_like_host(torch.ones(2, 3), torch.ones(2, 3), "ppo")
    assert "ppo" in str(info.value)


@SETTINGS
@given(
    st.sampled_from(LOSS_TYPES),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.floats(min_value=-3.0, max_value=3.0),
    st.integers(min_value=1, max_value=4),
)
def test_aggregate_is_linear_so_kl_term_adds_to_host_policy_loss(loss_type, seed, beta, accumulation_steps):
    """Agg(policy + β·k) = Agg(policy) + β·Agg(k): the separately aggregated KL term reproduces TRL's in-loss KL."""
    rng = np.random.default_rng(seed)
    batch, width = rng.integers(1, 6), rng.integers(1, 9)
    policy = torch.from_numpy(rng.normal(size=(batch, width)))
    kl = torch.from_numpy(rng.exponential(size=(batch, width)))
    mask = torch.from_numpy((rng.random((batch, width)) < 0.7).astype(np.int64))
    kw = dict(
        accumulation_steps=accumulation_steps, max_completion_length=width, token_normalizer=float(mask.sum()) + 1
    )
    combined = aggregate_like_host(policy + beta * kl, mask, loss_type, **kw).item()
    policy_term = aggregate_like_host(policy, mask, loss_type, **kw).item()
    kl_term = aggregate_like_host(kl, mask, loss_type, **kw).item()
    separate = policy_term + beta * kl_term
    assert combined == pytest.approx(separate, rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------------------------------------------------
# sequence_means and length_normalized_mean
# --------------------------------------------------------------------------------------------------------------------


def test_sequence_means_are_masked_token_means_and_zero_for_empty_rows():
    got = sequence_means(torch.tensor(VALUES, dtype=torch.float64), torch.tensor(MASK, dtype=torch.float64))
    expected = [(0.3 + 1.2 + 0.0 + 2.5 + 0.7) / 5, (4.0 + 0.1) / 2, 0.0, (0.2 + 0.6 + 1.1) / 3]
    assert got.shape == (4,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-14)


@pytest.mark.parametrize("accumulation_steps", [1.0, 2.0, 5.0])
def test_length_normalized_mean_is_mean_of_per_sequence_means(accumulation_steps):
    got = length_normalized_mean(
        torch.tensor(VALUES, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
        accumulation_steps=accumulation_steps,
    )
    per_seq = []
    for row, m in zip(VALUES, MASK):
        length = sum(m)
        per_seq.append(_seq_sum(row, m) / length if length else 0.0)
    assert got.item() == pytest.approx(sum(per_seq) / len(per_seq) / accumulation_steps, rel=1e-14)


def test_length_normalized_mean_coincides_with_grpo_default():
    values, mask = torch.tensor(VALUES, dtype=torch.float64), torch.tensor(MASK, dtype=torch.float64)
    for accumulation_steps in (1.0, 3.0):
        ln = length_normalized_mean(values, mask, accumulation_steps=accumulation_steps).item()
        grpo = aggregate_like_host(values, mask, "grpo", accumulation_steps=accumulation_steps).item()
        assert ln == pytest.approx(grpo, rel=1e-15)


@pytest.mark.parametrize("long_length", [4, 16, 64])
def test_length_normalization_removes_extra_weight_of_long_completions(long_length):
    """A long completion with per-token KL a and a short one with b: the length-normalized term is (a + b)/2
    whatever the lengths, while a token-sum loss type weighs the long one L_long/(L_long + L_short)."""
    a, b, short_length = 0.8, 0.2, 2
    values = torch.tensor([[a] * long_length, [b] * long_length], dtype=torch.float64)
    mask = torch.tensor([[1] * long_length, [1] * short_length + [0] * (long_length - short_length)])
    ln = length_normalized_mean(values, mask).item()
    dapo = aggregate_like_host(values, mask, "dapo", token_normalizer=float(long_length + short_length)).item()
    assert ln == pytest.approx((a + b) / 2, rel=1e-14)
    assert dapo == pytest.approx((long_length * a + short_length * b) / (long_length + short_length), rel=1e-14)


def test_length_normalized_gradient_gives_each_sequence_equal_weight():
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(
        length_normalized_mean(values, torch.tensor(MASK, dtype=torch.float64), accumulation_steps=2.0), values
    )
    expected = [[m / (max(sum(row), 1) * len(MASK) * 2.0) for m in row] for row in MASK]
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-14, atol=0.0)
    for row_grad, row in zip(grad.tolist(), MASK):  # each non-empty sequence's weights sum to 1/(B·G)
        if sum(row):
            assert math.fsum(row_grad) == pytest.approx(1.0 / (len(MASK) * 2.0), rel=1e-14)
