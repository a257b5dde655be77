"""`adapted_kl_term`, the whole per-micro-batch pipeline, against formulas written out here in float64."""

from __future__ import annotations

import pytest
import torch

from adaptive_kl.kl.metrics import STAT_INDEX
from adaptive_kl.kl.term import adapted_kl_term


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
