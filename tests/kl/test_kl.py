"""Per-token KL math (docs/design.md §§2-3): estimators, clamping, transforms and the importance ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_kl.kl.estimators import ESTIMATORS, clamp_log_ratio, importance_ratio, kl_estimate, transform_kl


SETTINGS = settings(max_examples=100, deadline=None)
CLIP = 20.0  # an opt-in clamp of the log-ratio (`kl_log_ratio_clip`): Unsloth's value
LOG_RATIOS = [-5.0, -1.0, -0.3, -1e-3, 0.0, 1e-3, 0.25, 1.0, 3.0, 7.5]

# Closed forms of docs/design.md §2, in plain Python floats.
CLOSED_FORM = {
    "k1": lambda r: r,
    "k2": lambda r: 0.5 * r * r,
    "k3": lambda r: math.exp(-r) + r - 1.0,
    "k1+": lambda r: r,  # straight-through: the value of k1 ...
    "k3+": lambda r: math.exp(-r) + r - 1.0,  # ... or of k3
}
# d est / d r, for the gradient checks.
CLOSED_FORM_GRAD = {
    "k1": lambda r: 1.0,
    "k2": lambda r: r,
    "k3": lambda r: 1.0 - math.exp(-r),
    "k1+": lambda r: r,  # ... with the gradient of k2
    "k3+": lambda r: r,
}


def _sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


finite_kl = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)
log_ratio_lists = st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=1, max_size=32)


# --------------------------------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------------------------------


def test_estimator_names_are_those_of_the_design():
    assert set(ESTIMATORS) == {"k1", "k2", "k3", "k1+", "k3+"}


@pytest.mark.parametrize("name", list(CLOSED_FORM))
def test_estimator_values_match_closed_form(name):
    r = _f64(LOG_RATIOS).reshape(2, 5)
    expected = [CLOSED_FORM[name](x) for x in LOG_RATIOS]
    direct = kl_estimate(r, name)
    assert direct.shape == r.shape
    np.testing.assert_allclose(direct.flatten().numpy(), expected, rtol=1e-13, atol=1e-15)


def test_kl_estimate_defaults_to_k3():
    r = _f64(LOG_RATIOS)
    expected = [CLOSED_FORM["k3"](x) for x in LOG_RATIOS]
    np.testing.assert_allclose(kl_estimate(r).numpy(), expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", list(CLOSED_FORM))
def test_estimator_gradient_wrt_log_ratio_matches_closed_form(name):
    r = _f64(LOG_RATIOS).requires_grad_()
    (grad,) = torch.autograd.grad(kl_estimate(r, name).sum(), r)
    np.testing.assert_allclose(grad.numpy(), [CLOSED_FORM_GRAD[name](x) for x in LOG_RATIOS], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("clip", [None, CLIP])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name,value_of", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_is_the_value_of_one_and_the_gradient_of_k2_bit_for_bit(name, value_of, dtype, clip):
    """k1+/k3+ report exactly k1/k3 and backpropagate exactly k2's gradient, tokens with |r| > 20 included; with the
    opt-in clamp at 20, k3+'s gradient there is 0 (k1+ and k2 are never clamped)."""
    logp = torch.tensor([-0.3, -2.0, -0.01, -5.0, -1.2, -30.0, -0.5], dtype=dtype)
    ref_logp = torch.tensor([-0.5, -1.0, -0.02, -4.0, -3.0, -0.1, -28.0], dtype=dtype)
    values, grads = {}, {}
    for estimator in (name, value_of, "k2"):
        policy = logp.clone().requires_grad_()
        estimate = kl_estimate(policy - ref_logp, estimator, clip)
        (grads[estimator],) = torch.autograd.grad(estimate.sum(), policy)
        values[estimator] = estimate.detach()
    assert torch.equal(values[name], values[value_of])
    if name == "k3+" and clip is not None:  # k2's gradient of the clamped log-ratio: k2's own inside, 0 beyond
        assert torch.equal(grads[name][:5], grads["k2"][:5])
        assert grads[name][5] == 0 and grads[name][6] == 0
    else:
        assert torch.equal(grads[name], grads["k2"])
        assert grads[name][5] < -20 and grads[name][6] > 20  # r itself: k2's unclamped gradient


def test_straight_through_expected_gradient_is_the_reverse_kl_gradient():
    """Over y ~ π exactly: E_π[∇_θ k3+(y)] = Σ_y π(y) r(y) ∇ log π(y) = ∇_θ KL(π‖π_ref), while k3's is the forward
    KL's gradient ∇_θ KL(π_ref‖π) (Tang & Munos, 2025), for a softmax policy with logits θ."""
    theta = torch.tensor([0.3, -1.2, 0.8, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5, 0.2], dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    probs = logp.exp().detach()  # the sampling distribution: expectation weights, not differentiated

    def expected_gradient(estimator):
        (grad,) = torch.autograd.grad((probs * kl_estimate(logp - ref, estimator)).sum(), theta, retain_graph=True)
        return grad

    (reverse,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta, retain_graph=True)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta, retain_graph=True)
    torch.testing.assert_close(expected_gradient("k3+"), reverse, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(expected_gradient("k1+"), reverse, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(expected_gradient("k3"), forward, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(reverse, forward)  # the two gradients differ on this pair


def test_k2_gradient_wrt_policy_logp_equals_log_ratio():
    """docs/design.md §2: the gradient of k2 in the loss is the on-policy reverse-KL gradient, i.e. ∂k2/∂log π = r."""
    logp = [-0.3, -2.0, -0.01, -5.0, -1.2]
    ref_logp = [-0.5, -1.0, -0.02, -4.0, -3.0]
    logp_t = _f64(logp).requires_grad_()
    k = kl_estimate(logp_t - _f64(ref_logp), "k2")
    (grad,) = torch.autograd.grad(k.sum(), logp_t)
    np.testing.assert_allclose(grad.numpy(), [a - b for a, b in zip(logp, ref_logp)], rtol=1e-14)


@pytest.mark.parametrize("name", ["k1", "k3", "k1+", "k3+"])
def test_unbiased_estimator_monte_carlo_mean_converges_to_exact_kl(name):
    """Sample y ~ p, r = log p(y) − log q(y): E_p[k1] = E_p[k3] = KL(p‖q) = Σ p log(p/q).

    The estimate's exact variance is Σ p k² − (Σ p k)², so the tolerance is 5 standard errors of the mean of
    200k samples (a false failure has probability < 1e-6; the seed makes the test deterministic anyway).
    """
    p = [0.05, 0.15, 0.3, 0.5]
    q = [0.4, 0.3, 0.2, 0.1]
    exact_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    per_category = [CLOSED_FORM[name](math.log(pi) - math.log(qi)) for pi, qi in zip(p, q)]
    mean_k = sum(pi * k for pi, k in zip(p, per_category))
    variance = sum(pi * k * k for pi, k in zip(p, per_category)) - mean_k**2
    assert mean_k == pytest.approx(exact_kl, rel=1e-12)  # the estimator is unbiased on this distribution

    n = 200_000
    samples = np.random.default_rng(1234).choice(len(p), size=n, p=p)
    log_ratio = torch.from_numpy(np.log(p)[samples] - np.log(q)[samples])
    estimate = kl_estimate(log_ratio, name).mean().item()

    tolerance = 5 * math.sqrt(variance / n)
    assert tolerance < 0.02 * exact_kl  # the check is meaningful: much tighter than the KL itself
    assert abs(estimate - exact_kl) < tolerance


@SETTINGS
@given(log_ratio_lists, st.sampled_from([torch.float32, torch.float64]))
def test_k3_is_nonnegative(values, dtype):
    """k3 ≥ 0 for any log-ratio; finite with the opt-in clamp (without it, exp(−r) overflows as TRL's does)."""
    k = kl_estimate(torch.tensor(values, dtype=dtype), "k3", CLIP)
    assert torch.isfinite(k).all()
    assert (k >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_does_not_round_below_zero_for_small_log_ratios(dtype):
    """The naive exp(−r) + r − 1 rounds to −eps/2 for many tiny r of either sign; k3 must stay ≥ 0 there too."""
    magnitudes = torch.logspace(-12, -1, 10_000, dtype=dtype)
    for r in (magnitudes, -magnitudes):
        k = kl_estimate(r, "k3")
        assert (k >= 0).all()


def test_unknown_estimator_raises_naming_the_field():
    with pytest.raises(ValueError, match="kl_estimator") as info:
        kl_estimate(_f64([0.1]), "k4")
    assert "k4" in str(info.value)


# --------------------------------------------------------------------------------------------------------------------
# Clamping of the log-ratio
# --------------------------------------------------------------------------------------------------------------------


def test_clamp_bounds_log_ratio_and_keeps_in_range_values():
    r = _f64([-1e6, -100.0, -20.5, -3.0, 0.0, 2.5, 19.99, 100.0, math.inf])
    out = clamp_log_ratio(r, CLIP)
    c = CLIP
    assert out.tolist() == [-c, -c, -c, -3.0, 0.0, 2.5, 19.99, c, c]
    assert out.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clamp_upcasts_half_precision_to_float32(dtype):
    out = clamp_log_ratio(torch.tensor([-100.0, 0.5, 100.0], dtype=dtype), CLIP)
    assert out.dtype == torch.float32
    assert out.tolist() == [-CLIP, 0.5, CLIP]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_extreme_log_ratios_give_finite_estimates(name, dtype):
    """±100 would overflow exp in float32/bfloat16 (exp(100) ≈ 2.7e43): with the opt-in clamp k3 clamps its log-ratio
    and stays finite; k1 and k2, which do not exponentiate, are finite unclamped and keep the log-ratio's value (TRL's
    RLOO penalty)."""
    assert not torch.isfinite(torch.exp(torch.tensor([100.0], dtype=dtype))).all()  # the hazard is real
    r = torch.tensor([[-100.0, 100.0], [-1e4, 1e4]], dtype=dtype)
    k = kl_estimate(r, name, CLIP)
    assert k.dtype == torch.float32
    assert torch.isfinite(k).all()
    c = CLIP
    working = [max(-c, min(c, x)) for x in r.flatten().double().tolist()] if name == "k3" else r.flatten().tolist()
    expected = [CLOSED_FORM[name](x) for x in working]
    np.testing.assert_allclose(k.flatten().double().numpy(), expected, rtol=1e-6)


def test_k1_is_never_clamped():
    """One token at r = 24.8 with the clamp at 20: k1 is 24.8 (TRL's RLOO penalty), not the clamp's 20; k3 is
    clamped."""
    r = _f64([[24.8, -0.1]])
    assert kl_estimate(r, "k1", CLIP).tolist() == [[24.8, -0.1]]
    assert kl_estimate(r, "k3", CLIP)[0, 0].item() == pytest.approx(math.expm1(-CLIP) + CLIP)


def test_estimate_has_zero_gradient_outside_clamp_range():
    r = _f64([-50.0, -19.0, 0.5, 19.0, 50.0]).requires_grad_()
    (grad,) = torch.autograd.grad(kl_estimate(r, "k3", CLIP).sum(), r)
    assert grad[0].item() == 0.0 and grad[-1].item() == 0.0
    np.testing.assert_allclose(grad[1:-1].numpy(), [1.0 - math.exp(-x) for x in (-19.0, 0.5, 19.0)], rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_by_default_k3_is_trls_arithmetic_past_any_clamp(dtype):
    """Without `log_ratio_clip` (the default) k3 is TRL's exp(ref − logp) − (ref − logp) − 1 on the raw log-ratio, far
    past ±20 too (to rounding: we evaluate it as expm1(−r) + r), and overflows where TRL's does: a policy far from its
    reference trains as stock does. Its gradient, 1 − exp(−r), is not cut off."""
    logp = torch.tensor([-1.0, -30.0, -2.0, -0.5, -3.0], dtype=dtype)
    ref = torch.tensor([-26.0, -1.0, -50.0, -0.4, -3.0], dtype=dtype)  # r = 25, −29, 48, −0.1, 0
    trl = torch.exp(ref - logp) - (ref - logp) - 1
    ours = kl_estimate(logp - ref, "k3")
    torch.testing.assert_close(ours, trl, rtol=4 * torch.finfo(dtype).eps, atol=4 * torch.finfo(dtype).eps)
    assert ours[1] > 1e12 and ours[2] == pytest.approx(47.0)  # not expm1(∓20) ± 20, the clamp's
    r = (logp - ref).requires_grad_()
    (grad,) = torch.autograd.grad(kl_estimate(r, "k3").sum(), r)
    torch.testing.assert_close(grad, 1 - torch.exp(-(logp - ref)), rtol=1e-5, atol=1e-12)
    far = torch.tensor([-100.0], dtype=torch.float32)  # exp(100) overflows float32, in TRL's formula too
    assert kl_estimate(far, "k3").isinf().all() and (torch.exp(-far) + far - 1).isinf().all()


def test_by_default_the_importance_ratio_is_trls_unclamped():
    """Without `log_ratio_clip` the bias correction's ratio is TRL's exp(log π − log π_old), also past 20."""
    logp, old = _f64([[-1.0, -2.0]]), _f64([[-26.0, -2.5]])
    ratio = importance_ratio(logp, old, _f64([[1.0, 1.0]]), "token")
    assert ratio.tolist() == torch.exp(logp - old).tolist()
    assert importance_ratio(logp, old, _f64([[1.0, 1.0]]), "token", CLIP)[0, 0].item() == math.exp(CLIP)


# --------------------------------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------------------------------


def test_clip_value_and_gradient_on_both_sides_of_threshold():
    c = 0.7
    k = _f64([0.0, 0.1, 0.69, 0.71, 1.5, 40.0]).requires_grad_()
    out = transform_kl(k, "clip", clip_threshold=c)
    assert out.tolist() == [0.0, 0.1, 0.69, c, c, c]
    (grad,) = torch.autograd.grad(out.sum(), k)
    assert grad.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


@SETTINGS
@given(st.lists(finite_kl, min_size=1, max_size=32), st.floats(min_value=1e-3, max_value=20.0))
def test_clip_is_bounded_by_threshold_and_identity_below(values, c):
    out = transform_kl(_f64(values), "clip", clip_threshold=c).tolist()
    for k, f in zip(values, out):
        assert 0.0 <= f <= c
        assert f == (k if k <= c else c)


@SETTINGS
@given(st.floats(min_value=1e-3, max_value=20.0), st.floats(min_value=0.0, max_value=1.0))
def test_clip_is_continuous_at_threshold(c, delta):
    """f(c) = c and f is 1-Lipschitz across the threshold: |f(c ± δ) − c| ≤ δ."""
    below, at, above = transform_kl(_f64([c - delta, c, c + delta]), "clip", clip_threshold=c).tolist()
    assert at == c
    # c − δ is itself rounded to float64 before clipping: by at most half an ulp of c (up to 1.8e-15 at c = 20).
    assert abs(below - c) <= delta * (1 + 1e-12) + math.ulp(c)
    assert above == c


SIGMOID_POINTS = [-0.5, 0.0, 0.02, 0.1, 0.3, 1.0, 4.0]


@pytest.mark.parametrize("tau", [0.0, 0.1, 1.5])
def test_sigmoid_value_and_gradient_match_analytic(tau):
    """f(k) = σ(k−τ)·k and f'(k) = σ(k−τ)(1−σ(k−τ))·k + σ(k−τ): the gradient flows through both factors."""
    k = _f64(SIGMOID_POINTS).requires_grad_()
    out = transform_kl(k, "sigmoid", target=tau)
    (grad,) = torch.autograd.grad(out.sum(), k)
    s = [_sigma(x - tau) for x in SIGMOID_POINTS]
    expected_value = [si * x for si, x in zip(s, SIGMOID_POINTS)]
    np.testing.assert_allclose(out.detach().numpy(), expected_value, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(
        grad.numpy(), [si * (1 - si) * x + si for si, x in zip(s, SIGMOID_POINTS)], rtol=1e-13, atol=1e-16
    )


def test_sigmoid_is_half_of_kl_at_target():
    assert transform_kl(_f64([0.25]), "sigmoid", target=0.25).item() == pytest.approx(0.125, rel=1e-15)


@SETTINGS
@given(st.lists(finite_kl, min_size=1, max_size=32), st.floats(min_value=0.0, max_value=5.0))
def test_sigmoid_is_between_zero_and_kl(values, tau):
    out = transform_kl(_f64(values), "sigmoid", target=tau).tolist()
    for k, f in zip(values, out):
        assert 0.0 <= f <= k


@SETTINGS
@given(finite_kl, finite_kl, st.floats(min_value=0.0, max_value=5.0))
def test_sigmoid_is_nondecreasing_in_kl(a, b, tau):
    lo, hi = sorted((a, b))
    f_lo, f_hi = transform_kl(_f64([lo, hi]), "sigmoid", target=tau).tolist()
    assert f_lo <= f_hi


def test_transform_dispatch_matches_closed_forms():
    values = [0.0, 0.05, 0.4, 2.0, 9.0]
    k = _f64(values)
    assert transform_kl(k, None) is k
    np.testing.assert_array_equal(transform_kl(k, "clip", clip_threshold=0.5).numpy(), [min(x, 0.5) for x in values])
    np.testing.assert_array_equal(transform_kl(k, "clip").numpy(), [min(x, 1.0) for x in values])  # default c = 1
    np.testing.assert_allclose(
        transform_kl(k, "sigmoid", target=0.3).numpy(), [_sigma(x - 0.3) * x for x in values], rtol=1e-13
    )
    np.testing.assert_allclose(
        transform_kl(k, "sigmoid").numpy(),
        [_sigma(x - 0.1) * x for x in values],
        rtol=1e-13,  # default τ = 0.1
    )


def test_unknown_transform_raises():
    with pytest.raises(ValueError, match="transform") as info:
        transform_kl(_f64([0.1]), "tanh")
    assert "tanh" in str(info.value)


@SETTINGS
@given(
    log_ratio_lists,
    st.sampled_from(["k2", "k3"]),
    st.sampled_from([None, "clip", "sigmoid"]),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
)
def test_adapted_estimate_is_finite_nonnegative_and_at_most_raw(values, estimator, transform, dtype):
    """Estimator then transform, for any log-ratio and dtype with the opt-in clamp: 0 ≤ f(k) ≤ k and everything
    finite."""
    k = kl_estimate(torch.tensor(values, dtype=dtype), estimator, CLIP)
    f = transform_kl(k, transform, clip_threshold=0.5, target=0.2)
    assert torch.isfinite(f).all()
    assert (f >= 0).all()
    assert (f <= k).all()
    if transform == "clip":
        assert (f <= 0.5).all()


# --------------------------------------------------------------------------------------------------------------------
# Importance ratio (use_bias_correction_kl)
# --------------------------------------------------------------------------------------------------------------------

LOGP = [[-0.5, -1.0, -2.0, -0.1], [-0.3, -0.2, -9.0, -9.0], [-1.0, -1.0, -1.0, -1.0]]
OLD_LOGP = [[-0.4, -1.5, -1.0, -0.1], [-0.5, -0.1, 0.0, 0.0], [-2.0, -2.0, -2.0, -2.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]


def test_token_importance_ratio_matches_formula():
    ratio = importance_ratio(_f64(LOGP), _f64(OLD_LOGP), _f64(MASK), "token")
    expected = [[math.exp(a - b) for a, b in zip(row, old)] for row, old in zip(LOGP, OLD_LOGP)]
    assert ratio.shape == (3, 4)
    np.testing.assert_allclose(ratio.numpy(), expected, rtol=1e-14)


def test_token_importance_ratio_is_default_level():
    ratio = importance_ratio(_f64(LOGP), _f64(OLD_LOGP), _f64(MASK))
    assert ratio.shape == (3, 4)
    assert ratio[0, 1].item() == pytest.approx(math.exp(0.5), rel=1e-14)


def test_sequence_importance_ratio_is_exp_of_masked_mean_log_ratio():
    ratio = importance_ratio(_f64(LOGP), _f64(OLD_LOGP), _f64(MASK), "sequence")
    assert ratio.shape == (3, 1)
    expected = []
    for row, old, m in zip(LOGP, OLD_LOGP, MASK):
        length = sum(m)
        total = sum((a - b) for a, b, mi in zip(row, old, m) if mi)
        expected.append([math.exp(total / length) if length else 1.0])  # empty row: exp(0)
    np.testing.assert_allclose(ratio.numpy(), expected, rtol=1e-14)


def test_importance_ratio_gradients():
    """Token: ∂ρ_t/∂log π_t = ρ_t. Sequence: ∂ρ_i/∂log π_it = ρ_i·m_it/L_i (padding gets no gradient)."""
    logp = _f64(LOGP).requires_grad_()
    (grad_token,) = torch.autograd.grad(importance_ratio(logp, _f64(OLD_LOGP), _f64(MASK), "token").sum(), logp)
    np.testing.assert_allclose(
        grad_token.numpy(), [[math.exp(a - b) for a, b in zip(r, o)] for r, o in zip(LOGP, OLD_LOGP)], rtol=1e-14
    )
    seq = importance_ratio(logp, _f64(OLD_LOGP), _f64(MASK), "sequence")
    (grad_seq,) = torch.autograd.grad(seq.sum(), logp)
    for i, m in enumerate(MASK):
        length = sum(m)
        for t, mi in enumerate(m):
            expected = seq[i, 0].item() * mi / length if length else 0.0
            assert grad_seq[i, t].item() == pytest.approx(expected, rel=1e-13, abs=1e-300)


def test_unknown_importance_level_raises_naming_the_field():
    with pytest.raises(ValueError, match="importance_sampling_level"):
        importance_ratio(_f64(LOGP), _f64(OLD_LOGP), _f64(MASK), "group")
