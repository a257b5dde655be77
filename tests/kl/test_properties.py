"""Property-based and hostile-input tests of the pure formula functions (docs/design.md §§2-5 and 7).

The other test files check the formulas on fixed examples. Here hypothesis draws random inputs, and every test checks
an invariant or compares with an independent float64 formula:

- bounds, monotonicity and continuity at the thresholds of the estimators, the transforms, the step scaling α(t) and
  the β update rules (`kl`, `controller`);
- composition and linearity: `adapted_kl_term` equals estimate → transform → aggregate, in value and in gradient, and
  every aggregation is linear and ignores padding. This linearity is what makes parity with TRL hold (`term`,
  `aggregation`);
- hostile inputs: log-ratios of ±100 in float32/bfloat16, fully masked rows and batches, T = 0, non-finite
  statistics fed to `BetaController` in any order, invalid saved states, and non-finite or extreme-scale
  correlation moments (`metrics`).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from tiny import adapted_kl_term, kl_statistics

from adaptive_kl.kl.aggregation import LOSS_TYPES, aggregate_like_host, length_normalized_mean, sequence_means
from adaptive_kl.kl.controller import (
    DYNAMIC_TRIGGERS,
    KL_SCALINGS,
    BetaController,
    adaptive_kl_update,
    dynamic_decay,
    step_scale,
    stepwise_kl_update,
)
from adaptive_kl.kl.estimators import (
    EXPONENTIAL_ESTIMATORS,
    clamp_log_ratio,
    importance_ratio,
    kl_estimate,
    transform_kl,
)
from adaptive_kl.kl.metrics import (
    STAT_INDEX,
    STAT_NAMES,
    kl_metrics,
    pearson_from_moments,
)


FAST = settings(max_examples=80, deadline=None)
SLOW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TRANSFORMS = (None, "clip", "sigmoid")
SEEDS = st.integers(min_value=0, max_value=2**32 - 1)

# k3 = expm1(−r) + r cancels: its absolute rounding error is about ulp(r), so below these |r| the true value
# r²/2 may round to 0 (measured: up to |r| ≈ 1.8e-16 in float64 and ≈ 2.4e-7 in float32). Above them, k3 > 0.
K3_POSITIVE_FROM = {torch.float64: 1e-14, torch.float32: 1e-6}
# k2 = r²/2 only underflows (float32 subnormals end at 1.4e-45, float64 at 4.9e-324).
K2_POSITIVE_FROM = {torch.float64: 1e-150, torch.float32: 1e-20}


def _f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _closed_form_estimate(r: float, estimator: str) -> float:
    """docs/design.md §2 in Python floats, with the opt-in clamp: k3's log-ratio clamped to ±CLIP, k1's and k2's
    not."""
    if estimator == "k3":
        r = min(max(r, -CLIP), CLIP)
    if estimator == "k3":
        return math.expm1(-r) + r
    return {"k1": r, "k2": 0.5 * r * r}[estimator]


def _closed_form_transform(k: float, transform, c: float, tau: float) -> float:
    """docs/design.md §3 in Python floats."""
    if transform == "clip":
        return min(k, c)
    if transform == "sigmoid":
        return _sigma(k - tau) * k
    return k


def _random_mask(rng, batch: int, width: int) -> np.ndarray:
    """Right-padded rows of random length, some with a gap inside, and (often) at least one fully masked row."""
    lengths = rng.integers(0, width + 1, size=batch)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float64)
    if width:
        gaps = rng.random((batch, width)) < 0.15
        mask[gaps] = 0.0
    if batch > 1 and rng.random() < 0.5:
        mask[rng.integers(0, batch)] = 0.0
    return mask


def _reference_aggregate(values, mask, loss_type, *, accumulation_steps, max_completion_length, token_normalizer):
    """docs/design.md §4, written independently: explicit per-sequence lengths and exactly rounded sums (math.fsum)."""
    batch = len(values)
    sums = [math.fsum(x for x, m in zip(row, m_row) if m) for row, m_row in zip(values, mask)]
    lengths = [sum(1 for m in m_row if m) for m_row in mask]
    if loss_type in ("grpo", "sapo", "length_normalized"):
        return math.fsum(s / n for s, n in zip(sums, lengths) if n) / batch / accumulation_steps
    if loss_type == "bnpo":
        return math.fsum(sums) / max(sum(lengths), 1) / accumulation_steps
    if loss_type == "dr_grpo":
        return math.fsum(sums) / (batch * max_completion_length) / accumulation_steps
    if loss_type in ("dapo", "cispo", "vespo"):
        return math.fsum(sums) / token_normalizer
    if loss_type == "luspo":
        return math.fsum(sums) / batch / accumulation_steps
    raise AssertionError(loss_type)


def _aggregate(values, mask, loss_type, **kw):
    """`aggregate_like_host`, or `length_normalized_mean` for the pseudo loss type "length_normalized"."""
    if loss_type == "length_normalized":
        return length_normalized_mean(values, mask, accumulation_steps=kw["accumulation_steps"])
    return aggregate_like_host(values, mask, loss_type, **kw)


def _moments(xs, ys):
    return (
        len(xs),
        math.fsum(xs),
        math.fsum(ys),
        math.fsum(x * x for x in xs),
        math.fsum(y * y for y in ys),
        math.fsum(x * y for x, y in zip(xs, ys)),
    )


# Log-ratios: ordinary values mixed with hostile ones (±100, far beyond the clamp, exactly at it, just past it).
CLIP = 20.0  # the opt-in clamp of the log-ratio (`kl_log_ratio_clip`) these properties hold with: Unsloth's value
HOSTILE_LOG_RATIOS = [-1e4, -100.0, -20.5, -CLIP, CLIP, 20.5, 100.0, 1e4]
mixed_log_ratios = st.lists(
    st.one_of(st.floats(min_value=-5.0, max_value=5.0), st.sampled_from(HOSTILE_LOG_RATIOS)), min_size=1, max_size=24
)


# --------------------------------------------------------------------------------------------------------------------
# Estimators (kl.py)
# --------------------------------------------------------------------------------------------------------------------


@FAST
@given(
    st.lists(
        st.one_of(
            st.floats(min_value=-1e-3, max_value=1e-3),  # the cancellation region of k3, subnormals included
            st.floats(min_value=-1e4, max_value=1e4),
            st.just(0.0),
        ),
        min_size=1,
        max_size=48,
    ),
    st.sampled_from(["k2", "k3"]),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_k2_k3_are_nonnegative_and_vanish_only_at_zero(values, estimator, dtype):
    """k2, k3 ≥ 0 everywhere (float32 rounding of tiny |r| included), = 0 at r = 0, and > 0 once |r| is above the
    rounding level (K3_POSITIVE_FROM, K2_POSITIVE_FROM)."""
    r = torch.tensor(values, dtype=dtype)
    k = kl_estimate(r, estimator, CLIP)
    # what the estimator sees, in its working dtype (bf16 → float32), clamped for those that exponentiate it
    working = clamp_log_ratio(r, CLIP if estimator in EXPONENTIAL_ESTIMATORS else None)
    assert torch.isfinite(k).all()
    assert (k >= 0).all(), r[k < 0]
    assert (k[working == 0] == 0).all()
    threshold = (K3_POSITIVE_FROM if estimator == "k3" else K2_POSITIVE_FROM)[k.dtype]
    away = working.abs() >= threshold
    assert (k[away] > 0).all(), working[away & (k <= 0)]


@FAST
@given(
    st.floats(min_value=0.0, max_value=1e3),
    st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1e-6), st.floats(min_value=0.0, max_value=2.0)),
    st.floats(min_value=0.0, max_value=10.0),
    st.sampled_from([1.0, -1.0]),
    st.sampled_from(["k2", "k3"]),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_k2_k3_increase_with_abs_log_ratio_on_each_side(low, relative_gap, absolute_gap, side, estimator, dtype):
    """On each side of 0, est(r) is nondecreasing in |r| (up to k3's ulp(r) cancellation error), strictly increasing
    in float64 for separated |r| below k3's clamp (k2 has none), and k3 is constant beyond its clamp."""
    high = low * (1.0 + relative_gap) + absolute_gap
    k_low, k_high = kl_estimate(torch.tensor([side * low, side * high], dtype=dtype), estimator, CLIP).tolist()
    eps = torch.finfo(dtype).eps
    bound = CLIP if estimator == "k3" else math.inf
    assert k_high >= k_low - 4 * eps * min(high, bound)
    clamped_high = min(high, bound)
    if dtype == torch.float64 and low >= 1e-6 and clamped_high >= low * (1 + 1e-6):
        assert k_high > k_low
    if low >= bound:
        assert k_high == k_low


@FAST
@given(mixed_log_ratios, st.sampled_from(["k1", "k2", "k3"]), st.sampled_from([torch.float32, torch.bfloat16]))
def test_hostile_log_ratios_give_finite_estimates_and_gradients(values, estimator, dtype):
    """±100 mixed with ordinary values, in float32/bfloat16: the estimate is the float64 closed form (k3 on the clamped
    log-ratio, k1 and k2 on the log-ratio itself), its gradient is finite, 0 beyond k3's ±CLIP clamp, and
    has the sign of r elsewhere (1 for k1)."""
    r = torch.tensor(values, dtype=dtype, requires_grad=True)
    k = kl_estimate(r, estimator, CLIP)
    (grad,) = torch.autograd.grad(k.sum(), r)
    assert k.dtype == torch.float32
    assert torch.isfinite(k).all() and torch.isfinite(grad).all()
    working = r.detach().float().double()
    for r_i, k_i, g_i in zip(working.tolist(), k.double().tolist(), grad.double().tolist()):
        expected = _closed_form_estimate(r_i, estimator)
        # float32 relative rounding, plus k3's absolute cancellation error ≈ ulp(r)
        assert abs(k_i - expected) <= 1e-6 * abs(expected) + 4 * 1.2e-7 * min(abs(r_i), CLIP) + 1e-30
        if abs(r_i) > CLIP and estimator == "k3":
            assert g_i == 0.0
        elif estimator == "k1":
            assert g_i == 1.0
        else:
            assert g_i * r_i >= 0.0  # descends towards r = 0 from both sides


# --------------------------------------------------------------------------------------------------------------------
# Transforms (kl.py)
# --------------------------------------------------------------------------------------------------------------------


@FAST
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e3), min_size=1, max_size=32),
    st.floats(min_value=1e-3, max_value=50.0),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_clip_is_one_lipschitz_identity_below_and_bounded_by_threshold(values, c, dtype):
    """f(k) = min(k, c): f ≤ c (c as the working dtype represents it; exactly c in float64), f = k at or below c,
    gradient 1 below and 0 above c, and |f(a) − f(b)| ≤ |a − b| for every pair (hence continuous at c)."""
    k = torch.tensor(values, dtype=dtype, requires_grad=True)
    f = transform_kl(k, "clip", clip_threshold=c)
    (grad,) = torch.autograd.grad(f.sum(), k)
    c_working = torch.tensor(c, dtype=dtype).item()
    k_, f_ = k.detach(), f.detach()
    assert (f_ <= c_working).all()
    if dtype == torch.float64:
        assert (f_ <= c).all()
    below, above = k_ <= c_working, k_ > c_working
    assert torch.equal(f_[below], k_[below])
    assert (f_[above] == c_working).all()
    assert (grad[k_ < c_working] == 1).all() and (grad[above] == 0).all()
    assert ((f_[:, None] - f_[None, :]).abs() <= (k_[:, None] - k_[None, :]).abs()).all()


@FAST
@given(st.floats(min_value=1e-3, max_value=50.0), st.sampled_from([torch.float32, torch.float64]))
def test_clip_values_left_and_right_of_threshold_converge_to_it(c, dtype):
    """Continuity at k = c: f(c·(1 ± 2⁻ⁿ)) → c from both sides, with |f(c ± δ) − c| ≤ δ (plus the rounding of c)."""
    deltas = [c * 2.0**-n for n in range(1, 60)]
    left = transform_kl(torch.tensor([c - d for d in deltas], dtype=dtype), "clip", clip_threshold=c).tolist()
    right = transform_kl(torch.tensor([c + d for d in deltas], dtype=dtype), "clip", clip_threshold=c).tolist()
    slack = 2 * torch.finfo(dtype).eps * c
    for d, f_left, f_right in zip(deltas, left, right):
        assert abs(f_left - c) <= d + slack
        assert abs(f_right - c) <= slack
    assert abs(left[-1] - right[-1]) <= slack


@FAST
@given(
    st.lists(
        st.one_of(st.floats(min_value=0.0, max_value=2.0), st.floats(min_value=0.0, max_value=5e8)),
        min_size=2,
        max_size=48,
    ),
    st.sampled_from(["clip", "sigmoid"]),
    st.floats(min_value=1e-3, max_value=20.0),
    st.floats(min_value=0.0, max_value=5.0),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_transforms_are_nondecreasing_in_kl_and_match_closed_form(values, transform, c, tau, dtype):
    """Sorted k ≥ 0 stays sorted under clip and sigmoid (float32 too); f ∈ [0, k]; sigmoid is σ(k − τ)·k (float64)."""
    k = torch.tensor(sorted(values), dtype=dtype)
    f = transform_kl(k, transform, clip_threshold=c, target=tau)
    assert (f[1:] >= f[:-1]).all(), (k, f)
    assert (f >= 0).all() and (f <= k).all()
    c_working = torch.tensor(c, dtype=dtype).item()
    rtol = 1e-13 if dtype == torch.float64 else 4e-6  # float32: rounding of τ and of k − τ moves σ by ~|k|·eps
    for k_i, f_i in zip(k.tolist(), f.tolist()):
        expected = _closed_form_transform(k_i, transform, c_working, tau)
        assert abs(f_i - expected) <= rtol * abs(expected) + torch.finfo(dtype).tiny  # subnormals underflow


@FAST
@given(
    st.floats(min_value=0.0, max_value=50.0),
    st.floats(min_value=0.0, max_value=50.0),
    st.sampled_from([1.0, -1.0]),
    st.sampled_from(["k2", "k3"]),
    st.sampled_from(TRANSFORMS),
    st.floats(min_value=1e-3, max_value=20.0),
    st.floats(min_value=0.0, max_value=5.0),
)
def test_adapted_estimate_is_nondecreasing_in_abs_log_ratio(a, b, side, estimator, transform, c, tau):
    """r ↦ f(est(r)) is nondecreasing in |r| on each side of 0 (the transforms are monotone on k ≥ 0), up to k3's
    cancellation error near 0, in float64."""
    low, high = sorted((a, b))
    k = kl_estimate(_f64([side * low, side * high]), estimator)
    f_low, f_high = transform_kl(k, transform, clip_threshold=c, target=tau).tolist()
    assert f_high >= f_low - 16 * 2.3e-16 * (high + f_high)


# --------------------------------------------------------------------------------------------------------------------
# Aggregation (aggregation.py)
# --------------------------------------------------------------------------------------------------------------------

AGGREGATIONS = (*LOSS_TYPES, "length_normalized")


@FAST
@given(
    SEEDS,
    st.sampled_from(AGGREGATIONS),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=9),
    st.integers(min_value=1, max_value=4),
)
def test_aggregate_matches_independent_reference_and_ignores_padding(seed, loss_type, batch, width, accumulation):
    """Random batches (T = 0 and fully masked rows included): Agg equals an exactly rounded float64 reference, for
    bool/int/float masks; garbage (±1e30) at masked positions and extra padding columns change nothing; the sequence
    means lie between each row's smallest and largest masked value (0 for empty rows)."""
    rng = np.random.default_rng(seed)
    values = rng.exponential(size=(batch, width)) * rng.choice([1.0, -1.0], size=(batch, width))
    mask = _random_mask(rng, batch, width)
    kw = dict(
        accumulation_steps=float(accumulation),
        max_completion_length=width + 3,
        token_normalizer=float(mask.sum()) + 0.5,
    )
    expected = _reference_aggregate(values.tolist(), mask.tolist(), loss_type, **kw)
    tolerance = 1e-13 * _reference_aggregate(np.abs(values).tolist(), mask.tolist(), loss_type, **kw) + 1e-300
    mask_t = torch.from_numpy(mask)
    got = _aggregate(torch.from_numpy(values), mask_t, loss_type, **kw)
    assert got.dim() == 0 and math.isfinite(got.item())
    assert abs(got.item() - expected) <= tolerance
    for other_mask in (mask_t.bool(), mask_t.long()):
        assert abs(_aggregate(torch.from_numpy(values), other_mask, loss_type, **kw).item() - expected) <= tolerance

    garbage = np.where(mask > 0, values, rng.choice([1e30, -1e30], size=values.shape))
    padded_values = np.concatenate([garbage, rng.normal(size=(batch, 3)) * 1e30], axis=1)
    padded_mask = np.concatenate([mask, np.zeros((batch, 3))], axis=1)
    padded = _aggregate(torch.from_numpy(padded_values), torch.from_numpy(padded_mask), loss_type, **kw)
    assert abs(padded.item() - expected) <= tolerance

    means = sequence_means(torch.from_numpy(values), mask_t).tolist()
    for mean, row, m_row in zip(means, values.tolist(), mask.tolist()):
        kept = [x for x, m in zip(row, m_row) if m]
        if kept:
            assert min(kept) - 1e-12 * max(map(abs, kept)) <= mean <= max(kept) + 1e-12 * max(map(abs, kept))
        else:
            assert mean == 0.0


@FAST
@given(
    SEEDS,
    st.sampled_from(AGGREGATIONS),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=9),
    st.floats(min_value=-1e3, max_value=1e3),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
)
def test_aggregate_is_linear_for_every_loss_type(seed, loss_type, batch, width, b, dtype, tensor_normalizer):
    """Agg(a + b·x) = Agg(a) + b·Agg(x) for every loss type and the length-normalized mean, with fully masked rows,
    T = 0, float32 values and a tensor token normalizer: the separately aggregated KL term adds to the host's loss
    exactly as TRL's in-loss KL would (and Agg(0) = 0)."""
    rng = np.random.default_rng(seed)
    a = torch.from_numpy(rng.normal(size=(batch, width))).to(dtype)
    x = torch.from_numpy(rng.exponential(size=(batch, width))).to(dtype)
    mask = torch.from_numpy(_random_mask(rng, batch, width)).to(dtype)
    normalizer = float(mask.sum()) + 1.0
    kw = dict(
        accumulation_steps=float(rng.integers(1, 5)),
        max_completion_length=width + 1,
        token_normalizer=torch.tensor(normalizer, dtype=dtype) if tensor_normalizer else normalizer,
    )
    combined = _aggregate(a + b * x, mask, loss_type, **kw).double().item()
    separate = _aggregate(a, mask, loss_type, **kw).double().item() + b * _aggregate(x, mask, loss_type, **kw).item()
    scale = _aggregate(a.abs() + abs(b) * x, mask, loss_type, **kw).double().item()  # size of the summed terms
    eps = torch.finfo(dtype).eps
    assert abs(combined - separate) <= 64 * eps * scale + 1e-300
    assert _aggregate(torch.zeros_like(x), mask, loss_type, **kw).item() == 0.0


# Half-precision log-probs are real: off its fused Triton kernel (CPU, no Triton, unsupported shapes), TRL's
# selective_log_softmax returns bfloat16 log-probs for bfloat16 logits, and the trainer passes
# `mask.to(per_token_logps.dtype)`, as adapted_kl_term documents. A bfloat16 sum of ones is exact only up to 256
# (float16: 2048), so L_i = 257 becomes 256 and the KL term is normalized differently from TRL's policy term, which
# sums the integer completion mask.
@pytest.mark.parametrize("aggregation", ["grpo", "sapo", "bnpo", "length_normalized"])
@pytest.mark.parametrize(("dtype", "long_length"), [(torch.bfloat16, 257), (torch.float16, 2049)])
def test_half_precision_mask_gives_the_integer_mask_term_for_long_completions(dtype, long_length, aggregation):
    """adapted_kl_term with the mask in the dtype of per_token_logps (as documented) equals the term with TRL's
    integer completion mask, also for completions longer than the half-precision integer range."""
    g = torch.Generator().manual_seed(0)
    width = long_length + 2
    logps = (-1.0 - torch.rand(3, width, generator=g)).to(dtype)
    ref = (logps.float() + 0.5 * torch.randn(3, width, generator=g)).to(dtype)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, length in enumerate((long_length, 6, width - 1)):  # totals 521 (bf16) and 4105 (fp16): inexact too
        mask[row, :length] = 1
    kw = dict(loss_type="grpo" if aggregation == "length_normalized" else aggregation)
    kw["length_normalized"] = aggregation == "length_normalized"
    exact, _ = adapted_kl_term(logps, ref, mask, **kw)
    half, _ = adapted_kl_term(logps, ref, mask.to(dtype), **kw)
    assert half.item() == pytest.approx(exact.item(), rel=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# Step scaling and update rules (controller.py)
# --------------------------------------------------------------------------------------------------------------------


@FAST
@given(
    st.integers(min_value=-1000, max_value=10**12),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(KL_SCALINGS),
)
def test_step_scale_is_in_unit_interval_and_nonincreasing(t, dt, scaling):
    """α(t) ∈ (0, 1], α(t) = 1 for t ≤ 1, and α(t + dt) ≤ α(t) for each scaling; `exp`'s γ^(t−1) underflows to 0
    (at t ≈ 74000 for γ = 0.99), and is positive before."""
    now, later = step_scale(t, scaling), step_scale(t + dt, scaling)
    assert 0.0 <= later <= now <= 1.0
    assert later > 0.0 or (scaling == "exp" and t + dt > 70000)
    if t <= 1:
        assert now == 1.0


@pytest.mark.parametrize("scaling", KL_SCALINGS)
def test_step_scale_at_first_step_is_one_and_has_no_upward_jump(scaling):
    """α(1) = 1 for all scalings; where the closed form is defined at t = 1 (linear, sqrt) it agrees with it, so the
    t ≤ 1 rule adds no jump; log's 1/ln 2 > 1 is never used: α drops from 1 at t = 2."""
    assert step_scale(1, scaling) == 1.0
    closed_form_at_1 = {
        "none": 1.0,
        "linear": 1.0 / 1,
        "sqrt": 1.0 / math.sqrt(1),
        "log": 1.0 / math.log(2),
        "exp": 0.99**0,
    }
    if scaling != "log":
        assert step_scale(1, scaling) == closed_form_at_1[scaling]
    assert step_scale(2, scaling) <= step_scale(1, scaling) < closed_form_at_1["log"]


@FAST
@given(
    st.floats(min_value=1e-6, max_value=1e3),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=1e-3, max_value=1.0),
    st.floats(min_value=-10.0, max_value=10.0),
    st.sampled_from(["equal", "just_below", "just_above", "anywhere"]),
    st.floats(min_value=-20.0, max_value=20.0),
)
def test_dynamic_decay_boundary_and_bounds(beta, min_fraction, decay, threshold, where, anywhere):
    """dynamic: reward exactly at the threshold decays, the float just below does not; the result is
    max(β·decay, β_min) or β, never above β and never below β_min."""
    beta_min = beta * min_fraction
    reward = {
        "equal": threshold,
        "just_below": math.nextafter(threshold, -math.inf),
        "just_above": math.nextafter(threshold, math.inf),
        "anywhere": anywhere,
    }[where]
    new = dynamic_decay(beta, reward, reward_threshold=threshold, decay=decay, beta_min=beta_min)
    assert new == (max(beta * decay, beta_min) if reward >= threshold else beta)
    assert beta_min <= new <= beta
    if where == "just_below":
        assert new == beta


@FAST
@given(
    st.floats(min_value=1e-6, max_value=1e3),
    st.floats(min_value=1e-4, max_value=1.0),
    st.integers(min_value=1, max_value=10**5),
    st.data(),
)
def test_adaptive_update_is_monotone_lipschitz_and_continuous_at_the_error_clip(beta, target, horizon, data):
    """Ziegler's rule is nondecreasing in KL, moves β by at most β·(n/H)·|ΔKL|/target (so it is continuous, also where
    the ±0.2 error clip starts, KL = 0.8·target and 1.2·target), stays within β(1 ± 0.2·n/H) and, in the configured
    domain 0.2·n < H, stays > 0."""
    n = data.draw(st.integers(min_value=1, max_value=5 * horizon - 1), label="num_sequences")
    kl_a = data.draw(st.floats(min_value=0.0, max_value=10.0 * target), label="kl_a")
    kl_b = data.draw(st.floats(min_value=0.0, max_value=10.0 * target), label="kl_b")

    def update(kl):
        return adaptive_kl_update(beta, kl, target_kl=target, horizon=horizon, num_sequences=n)

    low, high = sorted((kl_a, kl_b))
    assert update(low) <= update(high)
    slope = beta * n / horizon / target  # largest |dβ/dKL|
    rounding = 1e-13 * beta  # rounding of KL/target (≤ 10) carried through n/H (< 5)
    assert abs(update(kl_a) - update(kl_b)) <= slope * abs(kl_a - kl_b) * (1 + 1e-9) + rounding
    for kl in (kl_a, kl_b):
        assert beta * (1 - 0.2 * n / horizon) - rounding <= update(kl) <= beta * (1 + 0.2 * n / horizon) + rounding
        assert update(kl) > 0
    for kink in (0.8 * target, 1.2 * target):
        at = update(kink)
        for m in range(1, 50):
            delta = kink * 2.0**-m
            for kl in (kink - delta, kink + delta):
                assert abs(update(kl) - at) <= slope * delta * (1 + 1e-9) + rounding


@FAST
@given(
    st.floats(min_value=1e-6, max_value=1e3),
    st.floats(min_value=1e-6, max_value=10.0),
    st.floats(min_value=0.0, max_value=100.0),
    st.floats(min_value=0.0, max_value=100.0),
)
def test_stepwise_update_is_monotone_with_exact_boundaries(beta, target, kl_a, kl_b):
    """Stepwise: β·{0.75, 1, 1.5}, nondecreasing in KL; KL exactly 1.5·target or 0.5·target leaves β unchanged, the
    next float above 1.5·target multiplies it by 1.5 and the float below 0.5·target by 0.75."""
    low, high = sorted((kl_a, kl_b))
    new_low = stepwise_kl_update(beta, low, target_kl=target)
    new_high = stepwise_kl_update(beta, high, target_kl=target)
    assert new_low <= new_high
    assert {new_low, new_high} <= {0.75 * beta, beta, 1.5 * beta}
    upper, lower = 1.5 * target, 0.5 * target
    assert stepwise_kl_update(beta, upper, target_kl=target) == beta
    assert stepwise_kl_update(beta, lower, target_kl=target) == beta
    assert stepwise_kl_update(beta, math.nextafter(upper, math.inf), target_kl=target) == 1.5 * beta
    assert stepwise_kl_update(beta, math.nextafter(lower, -math.inf), target_kl=target) == 0.75 * beta


# --------------------------------------------------------------------------------------------------------------------
# BetaController under hostile statistics (controller.py)
# --------------------------------------------------------------------------------------------------------------------

hostile_statistic = st.one_of(
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 1e308, -1e308, 5e-324]),  # 1.0: all groups agree
    st.floats(min_value=-2.0, max_value=2.0),
)
controller_settings = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["fixed", "dynamic", "adaptive", "stepwise"]),
        "dynamic_trigger": st.sampled_from(DYNAMIC_TRIGGERS),
        "saturation_threshold": st.floats(min_value=1e-3, max_value=1.0),
        "kl_scaling": st.sampled_from(KL_SCALINGS),
        "kl_scaling_rate": st.floats(min_value=0.5, max_value=1.0),
        "beta": st.one_of(st.floats(min_value=1e-4, max_value=10.0), st.just(1.7e308)),  # growth overflows
        "min_fraction": st.floats(min_value=0.0, max_value=1.0),
        "dynamic_beta_decay": st.floats(min_value=1e-3, max_value=1.0),
        "reward_threshold": st.floats(min_value=-1.0, max_value=1.0),
        "beta_schedule_steps": st.integers(min_value=1, max_value=80),
        "target_kl": st.floats(min_value=1e-4, max_value=1.0),
        "kl_horizon": st.integers(min_value=1, max_value=10**4),
        "max_factor": st.one_of(st.none(), st.floats(min_value=1.0, max_value=1e3)),  # beta_max = beta·max_factor
    }
)
# (step increment, mean_reward, mean_kl, num_sequences): steps mostly advance by one, sometimes jump, repeat or go
# back (a replay after a resume), so that most updates apply and some are ignored.
update_sequences = st.lists(
    st.tuples(
        st.one_of(st.just(1), st.integers(min_value=-3, max_value=4)),
        hostile_statistic,
        hostile_statistic,
        st.one_of(st.none(), st.integers(min_value=0, max_value=5 * 10**4)),
    ),
    max_size=40,
)


# α(t) for t ≥ 2, docs/design.md §5.
_EXPECTED_SCALE = {
    "none": lambda t: 1.0,
    "linear": lambda t: 1.0 / t,
    "sqrt": lambda t: t**-0.5,
    "log": lambda t: 1.0 / math.log1p(t),
    "exp": lambda t, rate: rate ** (t - 1),
}


def _controller(p) -> BetaController:
    mode = p["mode"]
    return BetaController(
        p["beta"],
        dynamic=mode == "dynamic",
        dynamic_beta_decay=p["dynamic_beta_decay"],
        dynamic_trigger=p["dynamic_trigger"],
        reward_threshold=p["reward_threshold"],
        saturation_threshold=p["saturation_threshold"],
        beta_min=p["beta"] * p["min_fraction"],
        beta_schedule_steps=p["beta_schedule_steps"],
        kl_scaling=p["kl_scaling"],
        kl_scaling_rate=p["kl_scaling_rate"],
        kl_controller=mode if mode in ("adaptive", "stepwise") else "fixed",
        target_kl=p["target_kl"],
        kl_horizon=p["kl_horizon"],
        beta_max=_beta_max(p),
    )


def _beta_max(p) -> float | None:
    """The ceiling drawn: None (β's start), or β·max_factor where that is finite."""
    if p["max_factor"] is None or not math.isfinite(p["beta"] * p["max_factor"]):
        return None
    return p["beta"] * p["max_factor"]


def _reference_update(p, beta, reward, kl, n):
    """docs/design.md §5 in plain Python: (new β_base, "skipped", "held" or None) for one step's statistics; the
    saturation trigger and the controllers' hold read the fraction of zero-std groups, which the test passes in the
    KL's slot."""
    mode, beta_min = p["mode"], p["beta"] * p["min_fraction"]
    if mode == "dynamic":
        saturation = p["dynamic_trigger"] == "saturation"
        statistic, threshold = (kl, p["saturation_threshold"]) if saturation else (reward, p["reward_threshold"])
        if statistic is None or not math.isfinite(statistic):
            return beta, "skipped"
        return (max(beta * p["dynamic_beta_decay"], beta_min) if statistic >= threshold else beta), None
    if mode == "fixed":
        return beta, None
    if kl is None or not math.isfinite(kl) or not n:
        return beta, "skipped"
    if kl == 1.0:  # the zero-std fraction: every group agreed
        return beta, "held"
    target = p["target_kl"]
    ceiling = p["beta"] if _beta_max(p) is None else _beta_max(p)
    if mode == "adaptive":
        error = min(max(kl / target - 1.0, -0.2), 0.2)
        new = beta * (1.0 + error * n / p["kl_horizon"])
    else:
        new = beta * (1.5 if kl > 1.5 * target else 0.75 if kl < 0.5 * target else 1.0)
    return min(max(new, beta_min), ceiling), None  # ×1.5 past the largest float gives inf: the ceiling


@SLOW
@given(controller_settings, update_sequences, st.data())
def test_beta_controller_survives_any_sequence_of_hostile_updates(p, updates, data):
    """Updates in any order with NaN/inf/None/huge statistics and zero sequences, for fixed, dynamic and both
    controllers and every kl_scaling: β_base follows the design rules (a float64 model), is never NaN/inf/negative nor
    below β_min nor above the ceiling (β under dynamic, beta_max under a controller), β_t is finite and ≥ 0 for any
    step, replayed steps change nothing, the skip counter counts the unusable statistics and the hold counter the steps
    where every group agreed, and a JSON state saved at any point resumes the same trajectory."""
    ctrl = _controller(p)
    beta_min = p["beta"] * p["min_fraction"]
    steps = np.cumsum([0] + [increment for increment, *_ in updates])[1:].tolist()
    updates = [
        (step, reward, kl, None if n is None else n % (5 * p["kl_horizon"]))  # the configured domain: 0.2·n < H
        for step, (_, reward, kl, n) in zip(steps, updates)
    ]
    split = data.draw(st.integers(min_value=0, max_value=len(updates)), label="resume_after")
    expected_beta, expected_last, expected_skipped, expected_decays, expected_held = p["beta"], 0, 0, 0, 0
    saved = None
    for i, (step, reward, kl, n) in enumerate(updates):
        if i == split:
            saved = json.dumps(ctrl.state_dict())
        ctrl.update(step, mean_reward=reward, zero_std_fraction=kl, mean_kl=kl, num_sequences=n)
        if step > expected_last:
            expected_last = step
            new, untouched = _reference_update(p, expected_beta, reward, kl, n)
            expected_skipped += untouched == "skipped"
            expected_held += untouched == "held"
            expected_decays += p["mode"] == "dynamic" and new != expected_beta
            expected_beta = new
        assert ctrl.beta_base == pytest.approx(expected_beta, rel=1e-12, abs=0.0)
        assert math.isfinite(ctrl.beta_base) and ctrl.beta_base >= max(beta_min, 0.0)
        assert ctrl.beta_base <= (p["beta"] if p["mode"] == "dynamic" or _beta_max(p) is None else _beta_max(p))
        assert (ctrl.last_step, ctrl.num_skipped_updates, ctrl.num_decays, ctrl.num_held_updates) == (
            expected_last,
            expected_skipped,
            expected_decays,
            expected_held,
        )
        for t in (-1, 1, 2, step, step + 1, p["beta_schedule_steps"] - 1, p["beta_schedule_steps"], 10**9):
            schedule_over = p["mode"] == "dynamic" and t >= p["beta_schedule_steps"]
            base = beta_min if schedule_over else ctrl.beta_base  # β_base(t)
            scale = _EXPECTED_SCALE[p["kl_scaling"]]
            alpha = 1.0 if t <= 1 else scale(t, p["kl_scaling_rate"]) if p["kl_scaling"] == "exp" else scale(t)
            assert ctrl.beta(t) == pytest.approx(base * alpha, rel=1e-14, abs=0.0)
            assert ctrl.beta_and_scale(t) == (ctrl.beta(t), pytest.approx(alpha, rel=1e-14, abs=0.0))
            assert math.isfinite(ctrl.beta(t)) and 0.0 <= ctrl.beta(t) <= base
    if saved is None:
        saved = json.dumps(ctrl.state_dict())
    resumed = _controller(p)
    resumed.load_state_dict(json.loads(saved))
    for step, reward, kl, n in updates[split:]:
        resumed.update(step, mean_reward=reward, zero_std_fraction=kl, mean_kl=kl, num_sequences=n)
    assert resumed.state_dict() == ctrl.state_dict()
    assert [resumed.beta(t) for t in range(-1, 90)] == [ctrl.beta(t) for t in range(-1, 90)]


@FAST
@given(
    st.one_of(
        st.floats(max_value=-5e-324),  # every negative float, -inf included
        st.sampled_from([math.nan, math.inf, -math.inf]),
    ),
    st.sampled_from(["float", "str", "numpy", "torch"]),
)
def test_load_state_dict_refuses_nan_inf_or_negative_beta_in_any_container(bad, container):
    """A saved β_base that is NaN, ±inf or negative, as a float, string, numpy or torch scalar, is refused with a
    ValueError naming beta_base, and the controller keeps its state."""
    value = {
        "float": bad,
        "str": repr(bad),
        "numpy": np.float64(bad),
        "torch": torch.tensor(bad, dtype=torch.float64),
    }[container]
    ctrl = BetaController(0.4, kl_controller="adaptive", target_kl=0.05, kl_horizon=100)
    ctrl.update(3, mean_kl=1.0, num_sequences=8)
    before = ctrl.state_dict()
    with pytest.raises(ValueError, match="beta_base"):
        ctrl.load_state_dict({"beta_base": value, "last_step": 9, "num_decays": 1, "num_skipped_updates": 2})
    assert ctrl.state_dict() == before


@FAST
@given(st.floats(min_value=0.0, max_value=1e300), st.integers(min_value=0, max_value=10**9))
def test_load_state_dict_accepts_any_finite_nonnegative_beta(beta_base, last_step):
    """Any finite β_base ≥ 0 round-trips through JSON exactly, and β_t is then finite for the saved step."""
    ctrl = BetaController(0.4, kl_scaling="sqrt")
    state = {
        "beta_base": beta_base,
        "last_step": last_step,
        "num_decays": 0,
        "num_skipped_updates": 0,
        "num_held_updates": 0,
    }
    ctrl.load_state_dict(json.loads(json.dumps(state)))
    assert ctrl.state_dict() == state
    assert math.isfinite(ctrl.beta(last_step + 1))


# --------------------------------------------------------------------------------------------------------------------
# Metrics (metrics.py)
# --------------------------------------------------------------------------------------------------------------------


@SLOW
@given(
    SEEDS,
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=9),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from(TRANSFORMS),
    st.floats(min_value=1e-3, max_value=2.0),
)
def test_metrics_of_random_batches_are_bounded_and_consistent(seed, batch, width, estimator, transform, c):
    """From any batch (fully masked rows, T = 0, all-masked): metrics finite, clip_fraction ∈ [0, 1] and equal to the
    share of masked tokens with k > c, kl_length_corr ∈ [−1, 1], seq_kl·B = raw_kl·tokens (two sums of the same Σ m·k),
    adapted ≤ raw for clip/sigmoid of a nonnegative estimate, and `kl` is the raw mean for k3."""
    rng = np.random.default_rng(seed)
    logps = torch.from_numpy(-rng.exponential(size=(batch, width)))
    ref = logps + torch.from_numpy(rng.normal(scale=rng.uniform(0.01, 3.0), size=(batch, width)))
    mask = torch.from_numpy(_random_mask(rng, batch, width))
    _, stats = adapted_kl_term(
        logps, ref, mask, estimator=estimator, transform=transform, clip_threshold=c, loss_type="bnpo"
    )
    metrics = kl_metrics(stats, beta=0.1, beta_scale=0.5)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    tokens, sequences = stats[STAT_INDEX["tokens"]].item(), stats[STAT_INDEX["sequences"]].item()
    assert (tokens, sequences) == (float(mask.sum()), float(batch))

    raw = [  # the masked tokens' estimates, in Python floats
        _closed_form_estimate(lp - rf, estimator)
        for lp_row, rf_row, m_row in zip(logps.tolist(), ref.tolist(), mask.tolist())
        for lp, rf, m in zip(lp_row, rf_row, m_row)
        if m
    ]
    assert 0.0 <= metrics["adaptive_kl/clip_fraction"] <= 1.0
    if transform == "clip":
        assert metrics["adaptive_kl/clip_fraction"] == pytest.approx(sum(k > c for k in raw) / max(len(raw), 1))
    else:
        assert metrics["adaptive_kl/clip_fraction"] == 0.0
    assert -1.0 <= metrics["adaptive_kl/kl_length_corr"] <= 1.0
    assert metrics["adaptive_kl/raw_kl"] == pytest.approx(math.fsum(raw) / max(len(raw), 1), rel=1e-10, abs=1e-12)
    seq_kl_sum, token_kl_sum = metrics["adaptive_kl/seq_kl"] * batch, metrics["adaptive_kl/raw_kl"] * tokens
    assert seq_kl_sum == pytest.approx(token_kl_sum, rel=1e-10, abs=1e-12)
    if transform is not None and estimator != "k1":
        assert metrics["adaptive_kl/adapted_kl"] <= metrics["adaptive_kl/raw_kl"] * (1 + 1e-12)
    if estimator == "k3":
        assert (stats[STAT_INDEX["host_kl"]] / max(stats[STAT_INDEX["tokens"]], 1.0)).item() == metrics[
            "adaptive_kl/raw_kl"
        ]


@FAST
@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=512), st.floats(min_value=0.0, max_value=10.0)),
        min_size=2,
        max_size=40,
    ),
    st.floats(min_value=1e-2, max_value=1e2),
    st.floats(min_value=-10.0, max_value=10.0),
)
def test_pearson_is_symmetric_and_invariant_under_affine_maps(points, scale, shift):
    """corr(x, y) ∈ [−1, 1], = corr(y, x), = corr(a·x + b, y) for a > 0 and = −corr(−x, y): the length/KL
    correlation does not depend on units or offsets."""
    x = [float(p[0]) for p in points]
    y = [p[1] for p in points]
    base = pearson_from_moments(*_moments(x, y))
    assert -1.0 <= base <= 1.0
    assert pearson_from_moments(*_moments(y, x)) == pytest.approx(base, abs=1e-9)
    assume(np.std(x) > 0.1 and np.std(y) > 1e-3 * max(np.mean(y), 1e-3))  # well conditioned moment formula
    mapped = [scale * v + shift for v in x]
    assert pearson_from_moments(*_moments(mapped, y)) == pytest.approx(base, abs=1e-6)
    assert pearson_from_moments(*_moments([-v for v in x], y)) == pytest.approx(-base, abs=1e-9)


@FAST
@example(points=[(1, 1.0), (2, 3.0), (4, 4.0)], x_exponent=-100, y_exponent=-100)
@example(points=[(1, 1.0), (2, 3.0), (4, 4.0)], x_exponent=100, y_exponent=100)
@given(
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=50), st.floats(min_value=0.0, max_value=10.0)),
        min_size=3,
        max_size=20,
    ),
    st.integers(min_value=-100, max_value=100),
    st.integers(min_value=-100, max_value=100),
)
def test_pearson_is_scale_free_while_the_moments_are_finite(points, x_exponent, y_exponent):
    """corr(s·x, t·y) = corr(x, y) for s, t ∈ [1e-100, 1e100]: all six moments stay finite and normal there."""
    x = [float(p[0]) for p in points]
    y = [p[1] for p in points]
    assume(np.std(x) > 0.1 and np.std(y) > 1e-2)
    base = pearson_from_moments(*_moments(x, y))
    s, t = 10.0**x_exponent, 10.0**y_exponent
    scaled = pearson_from_moments(*_moments([s * v for v in x], [t * v for v in y]))
    assert scaled == pytest.approx(base, abs=1e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["n", "sx", "sy", "sxx", "syy", "sxy"])
def test_non_finite_moments_give_nan_not_a_fabricated_correlation(where, bad):
    """A non-finite sum gives NaN, never the ±1 that Python's NaN-dropping min/max would turn it into."""
    moments = dict(zip(("n", "sx", "sy", "sxx", "syy", "sxy"), _moments([1.0, 2.0, 4.0], [0.1, 0.3, 0.2])))
    moments[where] = bad
    assert math.isnan(pearson_from_moments(*moments.values()))


def test_one_nan_log_prob_gives_nan_means_and_nan_correlation():
    """End to end: one NaN log-prob makes the KL means NaN, and the length/KL correlation NaN too (not +1)."""
    logps = torch.tensor([[-1.0, -0.5, -2.0], [-1.0, math.nan, -3.0], [-0.2, -0.1, -0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    _, stats = adapted_kl_term(logps, logps - 0.3, mask)
    metrics = kl_metrics(stats, beta=0.1, beta_scale=1.0)
    assert math.isnan(metrics["adaptive_kl/raw_kl"])
    assert math.isnan(metrics["adaptive_kl/kl_length_corr"])


# --------------------------------------------------------------------------------------------------------------------
# The whole term (term.py)
# --------------------------------------------------------------------------------------------------------------------


@SLOW
@given(
    SEEDS,
    st.integers(min_value=1, max_value=5),
    st.integers(min_value=0, max_value=8),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from(TRANSFORMS),
    st.booleans(),
    st.sampled_from(LOSS_TYPES),
    st.sampled_from([None, "token", "sequence", "on_policy"]),
)
def test_term_is_the_composition_of_the_small_functions(
    seed, batch, width, estimator, transform, length_normalized, loss_type, bias_correction
):
    """adapted_kl_term = aggregate(transform(kl_estimate(r) [· importance_ratio])) in value and in gradient w.r.t.
    per_token_logps, for every transform, loss type, length_normalized and bias correction; the value also equals an
    independent float64 closed form, and the statistics are kl_statistics of the composed k and f(k)."""
    rng = np.random.default_rng(seed)
    logps = torch.from_numpy(-rng.exponential(size=(batch, width)))
    ref = logps + torch.from_numpy(rng.normal(scale=rng.uniform(0.01, 2.0), size=(batch, width)))
    old = logps + torch.from_numpy(rng.normal(scale=0.3, size=(batch, width)))
    mask = torch.from_numpy(_random_mask(rng, batch, width))
    c, tau = float(rng.uniform(0.01, 1.0)), float(rng.uniform(0.0, 0.5))
    kw = dict(
        accumulation_steps=float(rng.integers(1, 5)),
        max_completion_length=width + 2,
        token_normalizer=float(mask.sum()) + 1.0,
    )
    level = "token" if bias_correction in (None, "on_policy") else bias_correction
    old_arg = None if bias_correction == "on_policy" else old

    leaf = logps.clone().requires_grad_()
    term, stats = adapted_kl_term(
        leaf,
        ref,
        mask,
        estimator=estimator,
        transform=transform,
        clip_threshold=c,
        target=tau,
        length_normalized=length_normalized,
        loss_type=loss_type,
        use_bias_correction=bias_correction is not None,
        old_per_token_logps=old_arg,
        importance_sampling_level=level,
        **kw,
    )
    (grad,) = torch.autograd.grad(term, leaf)

    leaf2 = logps.clone().requires_grad_()
    k = kl_estimate(leaf2 - ref, estimator)
    host = None if estimator == "k3" else kl_estimate((leaf2 - ref).detach(), "k3")
    if bias_correction is not None:
        ratio = importance_ratio(leaf2, leaf2.detach() if old_arg is None else old_arg, mask, level)
        k = k * ratio
        host = None if host is None else host * ratio.detach()
    f = transform_kl(k, transform, clip_threshold=c, target=tau)
    composed = _aggregate(f, mask, "length_normalized" if length_normalized else loss_type, **kw)
    (composed_grad,) = torch.autograd.grad(composed, leaf2)
    torch.testing.assert_close(term, composed, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(grad, composed_grad, rtol=1e-13, atol=1e-15)
    expected_stats = kl_statistics(k, f, mask, clip_threshold=c if transform == "clip" else None, host_kl=host)
    torch.testing.assert_close(stats, expected_stats, rtol=1e-13, atol=1e-15)

    # Independent closed form, token by token in Python floats.
    values = []
    for lp_row, rf_row, od_row, m_row in zip(logps.tolist(), ref.tolist(), old.tolist(), mask.tolist()):
        length = sum(m_row)
        seq_log_ratio = math.fsum((lp - od) * m for lp, od, m in zip(lp_row, od_row, m_row)) / max(length, 1)
        row = []
        for lp, rf, od in zip(lp_row, rf_row, od_row):
            k_t = _closed_form_estimate(lp - rf, estimator)
            if bias_correction == "token":
                k_t *= math.exp(lp - od)
            elif bias_correction == "sequence":
                k_t *= math.exp(seq_log_ratio)
            row.append(_closed_form_transform(k_t, transform, c, tau))
        values.append(row)
    aggregation = "length_normalized" if length_normalized else loss_type
    expected = _reference_aggregate(values, mask.tolist(), aggregation, **kw)
    scale = _reference_aggregate([[abs(v) for v in row] for row in values], mask.tolist(), aggregation, **kw)
    assert abs(term.item() - expected) <= 1e-11 * scale + 1e-300


@SLOW
@given(
    mixed_log_ratios,
    st.integers(min_value=1, max_value=4),
    st.sampled_from([torch.float32, torch.bfloat16]),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from(TRANSFORMS),
    st.sampled_from(AGGREGATIONS),
    st.booleans(),
    SEEDS,
)
def test_term_with_hostile_log_ratios_is_finite_with_finite_gradients(
    log_ratios, batch, dtype, estimator, transform, aggregation, on_policy_bias_correction, seed
):
    """Log-ratios of ±100 and beyond mixed with ordinary ones, in float32 and bfloat16, for every transform and
    aggregation (with and without on-policy bias correction), with the opt-in clamp: the term, its gradient and the
    statistics are finite; padding gets no gradient, and without bias correction neither do tokens beyond k3's ±CLIP
    clamp."""
    rng = np.random.default_rng(seed)
    width = len(log_ratios)
    r = np.tile(np.array(log_ratios), (batch, 1))
    base = -rng.exponential(size=(batch, width))
    logps = torch.from_numpy(base).to(dtype).requires_grad_()
    ref = torch.from_numpy(base - r).to(dtype)
    mask = torch.from_numpy(_random_mask(rng, batch, width)).to(dtype)
    term, stats = adapted_kl_term(
        logps,
        ref,
        mask,
        estimator=estimator,
        transform=transform,
        clip_threshold=0.5,
        target=0.2,
        length_normalized=aggregation == "length_normalized",
        loss_type="grpo" if aggregation == "length_normalized" else aggregation,
        max_completion_length=width,
        token_normalizer=float(mask.sum()) + 1.0,
        use_bias_correction=on_policy_bias_correction,
        log_ratio_clip=CLIP,
        importance_log_ratio_clip=CLIP,
    )
    (grad,) = torch.autograd.grad(term, logps)
    assert torch.isfinite(term).all() and torch.isfinite(grad).all()
    assert torch.isfinite(stats).all()
    assert all(math.isfinite(v) for v in kl_metrics(stats, beta=0.1, beta_scale=1.0).values())
    assert (grad[mask == 0] == 0).all()
    if not on_policy_bias_correction and estimator == "k3":
        working = (logps.detach() - ref).float()  # the log-ratio as the term computes it
        assert (grad[working.abs() > CLIP] == 0).all()


@SLOW
@given(
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=0, max_value=6),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from(TRANSFORMS),
    st.sampled_from(AGGREGATIONS),
    st.sampled_from(["token", "sequence", None]),
    SEEDS,
)
def test_fully_masked_batch_or_empty_completions_give_zero_term_and_finite_statistics(
    batch, width, dtype, estimator, transform, aggregation, bias_correction, seed
):
    """Every row masked (hostile values at the padding: ±100 log-ratios, and −inf policy log-probs when there is no
    bias correction, which, like TRL's, would compute −inf − (−inf) against π_old), or T = 0: the term is 0 with an
    all-zero finite gradient, the statistics count 0 tokens and B sequences, and the metrics are finite (means 0,
    correlation 0)."""
    rng = np.random.default_rng(seed)
    base = -rng.exponential(size=(batch, width))
    r = rng.choice([-100.0, 100.0, 0.3, -1.0], size=(batch, width))
    policy = base if bias_correction else np.where(rng.random((batch, width)) < 0.2, -np.inf, base)
    logps = torch.from_numpy(policy).to(dtype).requires_grad_()
    ref = torch.from_numpy(base - r).to(dtype)
    old = torch.from_numpy(base + rng.normal(size=(batch, width))).to(dtype)
    mask = torch.zeros(batch, width, dtype=dtype)
    term, stats = adapted_kl_term(
        logps,
        ref,
        mask,
        estimator=estimator,
        transform=transform,
        length_normalized=aggregation == "length_normalized",
        loss_type="grpo" if aggregation == "length_normalized" else aggregation,
        max_completion_length=max(width, 1),
        token_normalizer=1.0,
        use_bias_correction=bias_correction is not None,
        old_per_token_logps=old,
        importance_sampling_level=bias_correction or "token",
    )
    (grad,) = torch.autograd.grad(term, logps)
    assert term.item() == 0.0
    assert torch.isfinite(grad).all() and (grad == 0).all()
    assert torch.isfinite(stats).all()
    assert stats[STAT_INDEX["tokens"]].item() == 0.0 and stats[STAT_INDEX["sequences"]].item() == batch
    assert all(stats[STAT_INDEX[name]].item() == 0.0 for name in STAT_NAMES if name != "sequences")
    metrics = kl_metrics(stats, beta=0.1, beta_scale=1.0)
    assert all(math.isfinite(v) for v in metrics.values())
    assert (
        metrics["adaptive_kl/raw_kl"]
        == metrics["adaptive_kl/kl_length_corr"]
        == (stats[STAT_INDEX["host_kl"]] / max(stats[STAT_INDEX["tokens"]], 1.0)).item()
        == 0.0
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_corrected_term_is_finite_for_hostile_old_log_probs(level, dtype):
    """use_bias_correction_kl with |log π_θ − log π_old| = 100 on a sequence, with the opt-in clamp
    (`kl_log_ratio_clip`): the term and its gradient stay finite."""
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.0, -4.0]], dtype=dtype).requires_grad_()
    ref = (logps.detach().float() - 0.4).to(dtype)
    old = (logps.detach().float() - torch.tensor([[100.0], [0.1]])).to(dtype)
    mask = torch.ones(2, 3, dtype=dtype)
    term, stats = adapted_kl_term(
        logps, ref, mask, use_bias_correction=True, old_per_token_logps=old, importance_sampling_level=level,
        log_ratio_clip=CLIP, importance_log_ratio_clip=CLIP,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(term, logps)
    assert torch.isfinite(term).all() and torch.isfinite(grad).all()
    assert torch.isfinite(stats).all()
