"""`kl_mask_zero_std_groups`' formulas: the zero-std decision per group, and the KL term without the masked rows.

The masked term is checked against the definition written out here with loops: the masked rows' f(k) set to 0, every
normalizer (the token count, the sequence count, B·max_len, the global token count) the one the unmasked term uses.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny import adapted_kl_term
from trl.trainer.utils import nanstd

from adaptive_kl.kl.aggregation import LOSS_TYPES
from adaptive_kl.kl.groups import zero_std_groups
from adaptive_kl.kl.metrics import STAT_INDEX


MAX_COMPLETION_LENGTH = 6
TOKEN_NORMALIZER = 9.5
ACCUMULATION_STEPS = 2.0


def batch(seed=0):
    """Five sequences of lengths 6, 2, 0 (fully masked), 4 and 3 (one gap), with drifted reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    logps = -2 + torch.randn(5, 6, generator=g, dtype=torch.float64)
    ref = logps + 0.7 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 0, 0],
        ],
        dtype=torch.float64,
    )
    return logps, ref, mask


def masked_by_hand(logps, ref, mask, keep, loss_type, length_normalized=False):
    """The definition: Agg over rows whose k3 is set to 0 where `keep` is False, with the unmasked term's normalizers.

    Loops over sequences and tokens; `lengths` and `total` count every token of `mask`, kept or not."""
    rows = range(logps.size(0))
    k3 = [[0.0] * logps.size(1) for _ in rows]
    for i in rows:
        for t in range(logps.size(1)):
            r = logps[i, t] - ref[i, t]
            k3[i][t] = torch.exp(-r) + r - 1 if keep[i] else 0.0
    sums = [sum(k3[i][t] * mask[i, t] for t in range(logps.size(1))) for i in rows]
    lengths = [float(mask[i].sum()) for i in rows]
    total = sum(lengths)
    num = len(sums)
    if length_normalized or loss_type in ("grpo", "sapo"):  # mean of per-sequence means, over every sequence
        return sum(s / max(n, 1.0) for s, n in zip(sums, lengths)) / num / ACCUMULATION_STEPS
    if loss_type == "bnpo":  # the micro-batch's token count, masked rows' tokens included
        return sum(sums) / max(total, 1.0) / ACCUMULATION_STEPS
    if loss_type == "dr_grpo":
        return sum(sums) / (num * MAX_COMPLETION_LENGTH) / ACCUMULATION_STEPS
    if loss_type in ("dapo", "cispo", "vespo"):  # the global token count, as the host's policy loss divides by
        return sum(sums) / TOKEN_NORMALIZER
    if loss_type == "luspo":
        return sum(sums) / num / ACCUMULATION_STEPS
    raise AssertionError(loss_type)


def term(logps, ref, mask, loss_type, sequence_mask=None, length_normalized=False):
    return adapted_kl_term(
        logps,
        ref,
        mask,
        loss_type=loss_type,
        accumulation_steps=ACCUMULATION_STEPS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        token_normalizer=TOKEN_NORMALIZER,
        sequence_mask=sequence_mask,
        length_normalized=length_normalized,
    )


KEEP = torch.tensor([True, False, False, True, False])  # rows 1 and 4 masked (row 2 has no token anyway)


@pytest.mark.parametrize("length_normalized", [False, True], ids=["host", "length_normalized"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_masked_term_is_the_definition_for_every_loss_type(loss_type, length_normalized):
    logps, ref, mask = batch()
    leaf = logps.clone().requires_grad_()
    got, _ = term(leaf, ref, mask, loss_type, KEEP, length_normalized)
    by_hand_leaf = logps.clone().requires_grad_()
    expected = masked_by_hand(by_hand_leaf, ref, mask, KEEP, loss_type, length_normalized)
    assert got.item() == pytest.approx(expected.item(), rel=1e-13)
    got.backward()
    expected.backward()
    torch.testing.assert_close(leaf.grad, by_hand_leaf.grad, rtol=1e-13, atol=0)
    assert leaf.grad[~KEEP].abs().max().item() == 0.0  # the masked rows get no gradient from the KL
    assert leaf.grad[KEEP].abs().max().item() > 0.0


@pytest.mark.parametrize("length_normalized", [False, True], ids=["host", "length_normalized"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_mask_splits_the_term_additively(loss_type, length_normalized):
    """Term(kept) + Term(masked rows only) = Term(all): the normalizer never depends on the mask (a stale or shrunk
    denominator would break the sum)."""
    logps, ref, mask = batch(1)
    kept, _ = term(logps, ref, mask, loss_type, KEEP, length_normalized)
    rest, _ = term(logps, ref, mask, loss_type, ~KEEP, length_normalized)
    whole, _ = term(logps, ref, mask, loss_type, None, length_normalized)
    assert (kept + rest).item() == pytest.approx(whole.item(), rel=1e-14)
    assert 0 < kept.item() < whole.item() and 0 < rest.item() < whole.item()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_mask_that_keeps_every_row_changes_nothing_and_one_that_keeps_none_gives_zero(loss_type):
    logps, ref, mask = batch(2)
    plain_leaf, kept_leaf, none_leaf = (logps.clone().requires_grad_() for _ in range(3))
    plain, plain_stats = term(plain_leaf, ref, mask, loss_type)
    kept, kept_stats = term(kept_leaf, ref, mask, loss_type, torch.ones(5, dtype=torch.bool))
    none, none_stats = term(none_leaf, ref, mask, loss_type, torch.zeros(5, dtype=torch.bool))
    assert torch.equal(kept, plain) and none.item() == 0.0
    for value in (plain, kept, none):
        value.backward()
    assert torch.equal(kept_leaf.grad, plain_leaf.grad)
    assert torch.equal(none_leaf.grad, torch.zeros_like(logps))
    # The statistics (what the metrics and controllers read) cover every row, masked or not.
    assert torch.equal(kept_stats, plain_stats) and torch.equal(none_stats, plain_stats)
    assert plain_stats[STAT_INDEX["sequences"]].item() == 5


def test_a_masked_row_with_an_infinite_kl_adds_exactly_zero():
    logps, ref, mask = batch(3)
    ref = ref.clone()
    ref[1, 0] = math.inf  # k3 = exp(−r) + r − 1 with r = −inf: +inf
    got, _ = term(logps, ref, mask, "bnpo", KEEP)
    expected = masked_by_hand(logps, ref, mask, KEEP, "bnpo")
    assert math.isfinite(got.item()) and got.item() == pytest.approx(expected.item(), rel=1e-13)


# --- the decision: per group, as TRL decides `frac_reward_zero_std` --------------------------------------------------


def trls_decision(rewards: torch.Tensor, group: int) -> list[bool]:
    """TRL's own test (its `nanstd` and `torch.isclose(std, 0)`), per group, repeated over the group's completions."""
    std = nanstd(rewards.view(-1, group), dim=1)
    return torch.isclose(std, torch.zeros_like(std)).repeat_interleave(group).tolist()


@pytest.mark.parametrize(
    "rewards,expected_groups",
    [
        ([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0], [True, False]),  # one group agrees, the batch does not
        ([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0], [True, True]),  # each group agrees, the batch std is 0.53
        ([0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [False, False]),  # neither agrees
        ([0.5, 0.5 + 1e-10, 0.5, 0.5, 3.0, 3.0, 3.0, 3.1], [True, False]),  # isclose(std, 0): within 1e-8
        ([2.0, math.nan, 2.0, 2.0, 1.0, math.nan, math.nan, math.nan], [True, False]),  # one scored: NaN std
        ([math.nan] * 4 + [0.0, 0.0, 0.0, 0.0], [False, True]),  # none scored: NaN std
    ],
)
def test_zero_std_is_decided_per_group_as_trl_decides_it(rewards, expected_groups):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    got = zero_std_groups(rewards, 4)
    assert got.dtype == torch.bool and got.shape == (8,)
    expected = [flag for flag in expected_groups for _ in range(4)]
    assert got.tolist() == expected == trls_decision(rewards, 4)


def test_the_decision_is_the_groups_not_the_batchs():
    """TRL's own flag is batch-level under `scale_rewards="batch"` (TRL PR #7068's review): a batch-level test would
    mask nothing here, where the first group's rewards all agree and the batch's do not."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    batch_std = nanstd(rewards)
    assert not torch.isclose(batch_std, torch.zeros_like(batch_std))
    assert zero_std_groups(rewards, 4).tolist() == [True] * 4 + [False] * 4


def test_one_completion_per_group_is_zero_std_as_in_trl():
    """TRL takes the std as 0 with one completion per group (`num_generations_eval=1`): every advantage is 0."""
    assert zero_std_groups(torch.tensor([0.3, 1.0, -2.0]), 1).tolist() == [True, True, True]
