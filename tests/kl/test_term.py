"""`adapted_kl_term`, the whole per-micro-batch pipeline, against formulas written out here in float64."""

from __future__ import annotations

import pytest
import torch
from tiny import NOISE_FACTOR, adapted_kl_term

from adaptive_kl.kl.aggregation import token_sum_normalizer
from adaptive_kl.kl.metrics import STAT_INDEX
from adaptive_kl.kl.term import kl_term_and_sequence_sums


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    logps = -3 + torch.randn(3, 5, generator=g, dtype=torch.float64)
    ref = logps + 0.6 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    old = logps + 0.2 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    return logps, ref, old, mask


def _by_hand(logps, ref, old, mask, per_token, aggregate):
    """Σ over tokens written as Python loops over the masked entries."""
    values = [
        [per_token(logps[i, t], ref[i, t], old[i, t]) for t in range(logps.size(1)) if mask[i, t]]
        for i in range(logps.size(0))
    ]
    return aggregate(values)


def test_k2_sigmoid_bias_corrected_bnpo_matches_formula_and_gradient():
    logps, ref, old, mask = _batch()
    tau = 0.05

    def per_token(lp, rf, od):
        k = 0.5 * (lp - rf) ** 2 * torch.exp(lp - od)
        return torch.sigmoid(k - tau) * k

    def bnpo(values):  # token mean over the micro-batch, halved by two accumulation steps
        return sum(sum(row) for row in values) / sum(len(row) for row in values) / 2

    leaf = logps.clone().requires_grad_()
    term, stats = adapted_kl_term(
        leaf,
        ref,
        mask,
        estimator="k2",
        transform="sigmoid",
        target=tau,
        loss_type="bnpo",
        accumulation_steps=2.0,
        use_bias_correction=True,
        old_per_token_logps=old,
    )
    expected_leaf = logps.clone().requires_grad_()
    expected = _by_hand(expected_leaf, ref, old, mask, per_token, bnpo)
    assert term.item() == pytest.approx(expected.item(), rel=1e-12)
    term.backward()
    expected.backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad, rtol=1e-12, atol=0)

    # TRL's `kl` (host_kl) stays k3, corrected by the same ratio; raw_kl is the k2 estimate.
    r, ratio = logps - ref, torch.exp(logps - old)
    assert stats[STAT_INDEX["raw_kl"]].item() == pytest.approx((0.5 * r**2 * ratio * mask).sum().item(), rel=1e-12)
    host = (torch.expm1(-r) + r) * ratio
    assert stats[STAT_INDEX["host_kl"]].item() == pytest.approx((host * mask).sum().item(), rel=1e-12)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_clip_length_normalized_is_mean_of_sequence_means_whatever_the_loss_type(loss_type):
    logps, ref, old, mask = _batch(1)
    c = 0.02

    def per_token(lp, rf, od):
        return torch.clamp(torch.expm1(rf - lp) + (lp - rf), max=c)

    def mean_of_means(values):
        return sum(sum(row) / len(row) for row in values) / len(values) / 4

    term, stats = adapted_kl_term(
        logps,
        ref,
        mask,
        transform="clip",
        clip_threshold=c,
        length_normalized=True,
        loss_type=loss_type,
        accumulation_steps=4.0,
        max_completion_length=5,
        token_normalizer=123.0,
    )
    expected = _by_hand(logps, ref, old, mask, per_token, mean_of_means)
    assert term.item() == pytest.approx(expected.item(), rel=1e-12)
    k3 = torch.expm1(ref - logps) + (logps - ref)
    assert stats[STAT_INDEX["clipped"]].item() == ((k3 > c) * mask).sum().item() > 0


def trl_style_term(logps, ref, old, mask, keep, loss_type, options, dtype):
    """The term written out independently of the package: each estimate from its formula, times the importance ratio
    as TRL's loss weights its KL (`use_bias_correction_kl`), bounded, transformed, the sequences of `keep` only, and
    aggregated as TRL's `GRPOTrainer._compute_loss` aggregates its per-token loss (or, `length_normalized`, the mean
    of the sequences' token means), in `dtype`, differentiable through `logps`."""
    logps, ref, old, mask = (t.to(dtype) for t in (logps, ref, old, mask))
    r = logps - ref
    k3 = torch.exp(-r) + r - 1
    estimates = {"k1": r, "k2": r**2 / 2, "k3": k3, "k3+": k3.detach() + (r**2 / 2 - (r**2 / 2).detach())}
    k = estimates[options["estimator"]]
    if options.get("use_bias_correction"):
        log_ratio = logps - old
        if options.get("importance_sampling_level") == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        k = k * torch.exp(log_ratio)
    if "kl_bound" in options:
        k = k.clamp(-options["kl_bound"], options["kl_bound"])
    transform = options.get("transform")
    f = k.clamp(max=options["clip_threshold"]) if transform == "clip" else k
    f = torch.sigmoid(k - options["target"]) * k if transform == "sigmoid" else f
    f = f * keep.to(dtype).unsqueeze(-1)
    lengths = mask.sum(-1).clamp(min=1.0)
    accumulation, rows = 3.0, len(mask)
    if options.get("length_normalized") or loss_type == "grpo":
        return ((f * mask).sum(-1) / lengths).mean() / accumulation
    if loss_type == "bnpo":
        return (f * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return (f * mask).sum() / (rows * 9) / accumulation
    if loss_type == "dapo":
        return (f * mask).sum() / 37.0
    return (f * mask).sum(-1).mean() / accumulation  # luspo


# Whatever the tokens outside the mask hold (finite log-probabilities far from the reference's, a reference of
# −inf), they reach no term, gradient or per-sequence sum: all three are, to the bit, those of the same batch with
# clean values there, in float32 where rounding would show. The term and its gradient are TRL's aggregation of the
# masked term, written out independently (`trl_style_term`), within the noise floor of float32: the oracle's own
# distance between float32 and float64 (at least float32's resolution of the value).
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize(
    "options",
    [
        dict(estimator="k3", transform="clip", clip_threshold=0.05, use_bias_correction=True),
        dict(estimator="k3+", transform="sigmoid", target=0.02, use_bias_correction=True),
        dict(estimator="k1", kl_bound=0.1, use_bias_correction=True, importance_sampling_level="sequence"),
        dict(estimator="k2", length_normalized=True),
    ],
    ids=["k3-clip-ratio", "k3+-sigmoid-ratio", "k1-bound-sequence-ratio", "k2-length-normalized"],
)
def test_tokens_outside_the_mask_reach_nothing(loss_type, options):
    g = torch.Generator().manual_seed(7)
    logps = -2 + 0.5 * torch.randn(6, 9, generator=g)
    ref = logps + 0.3 * torch.randn(6, 9, generator=g)
    old = logps + 0.1 * torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    mask[0] = 0.0  # a sequence with no token
    outside = mask == 0
    garbage_logps, garbage_ref = logps.clone(), ref.clone()
    garbage_logps[outside] = 40 * torch.randn(int(outside.sum()), generator=g)
    garbage_ref[outside & (torch.rand(6, 9, generator=g) > 0.5)] = -torch.inf
    keep = torch.tensor([True, True, False, True, True, False])
    settings = dict(
        loss_type=loss_type, max_completion_length=9, token_normalizer=torch.tensor(37.0), accumulation_steps=3.0
    )
    results = []
    for policy, reference in ((garbage_logps, garbage_ref), (logps, ref)):
        leaf = policy.clone().requires_grad_()
        term, sums = kl_term_and_sequence_sums(
            leaf, reference, mask, old_per_token_logps=old, sequence_mask=keep, **settings, **options
        )
        (grad,) = torch.autograd.grad(term, leaf)
        _, measured = kl_term_and_sequence_sums(
            leaf, reference, mask, old_per_token_logps=old, with_term=False, **options
        )
        results.append((term, grad, sums, measured))
    (term, grad, sums, measured), (clean_term, clean_grad, clean_sums, _) = results
    assert torch.isfinite(term) and torch.isfinite(grad).all() and torch.isfinite(sums).all()
    assert torch.equal(term, clean_term) and torch.equal(grad, clean_grad) and torch.equal(sums, clean_sums)
    assert torch.equal(measured, sums)  # measured alone, the same sums
    assert not grad[outside].any()  # no gradient outside the mask
    oracle = {}
    for dtype in (torch.float32, torch.float64):
        leaf = logps.clone().to(dtype).requires_grad_()
        value = trl_style_term(leaf, ref, old, mask, keep, loss_type, options, dtype)
        oracle[dtype] = (value.detach(), torch.autograd.grad(value, leaf)[0])
    (value32, grad32), (value64, grad64) = oracle[torch.float32], oracle[torch.float64]
    eps = torch.finfo(torch.float32).eps
    value_floor = max(abs(value32.double() - value64).item(), eps * abs(value64).item())
    grad_floor = max((grad32.double() - grad64).abs().max().item(), eps * grad64.abs().max().item())
    assert abs(term.double() - value64).item() <= NOISE_FACTOR * value_floor
    assert (grad.double() - grad64).abs().max().item() <= NOISE_FACTOR * grad_floor
    assert abs(value64).item() > 1e3 * value_floor  # the oracle is not a rounding-level quantity


@pytest.mark.parametrize(
    ("processes", "accumulation", "per_generation"),
    [(1, 1, 1), (1, 1, None), (2, 3, 4), (3, 2, 2), (1, 4, 4), (1, 5, 5)],
)
def test_token_sum_normalizer_is_trls_bit_for_bit(processes, accumulation, per_generation):
    """What TRL 1.15/1.16's `_compute_loss` divides the token sum by (dapo, cispo, vespo), in its order of operations;
    the arithmetic by 1 that `token_sum_normalizer` skips changes no bit. Only by 1: N · 5 / 5 is not N for every N
    (16777215 · 5 rounds in float32), so skipping equal accumulation steps would fail the last case."""
    items = torch.tensor([0.0, 1.0, 37.0, 1234567.0, 16777215.0])
    trls = items.clamp(min=1.0) / processes
    if per_generation:
        trls = trls * accumulation / per_generation
    assert torch.equal(token_sum_normalizer(items, processes, accumulation, per_generation), trls)
