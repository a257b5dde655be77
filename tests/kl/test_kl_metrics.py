"""`adaptive_kl/*` metrics (docs/design.md §7) from additive sufficient statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tiny import kl_statistics

from adaptive_kl.kl.metrics import (
    METRIC_NAMES,
    STAT_INDEX,
    STAT_NAMES,
    kl_metrics,
    kl_sequence_sums,
    pearson_from_moments,
    statistics_of_sequences,
)


SETTINGS = settings(max_examples=60, deadline=None)

# Five sequences: lengths 4, 2, 0 (fully masked), 3, 1.
RAW = [
    [0.10, 1.50, 0.20, 0.05, 9.0],
    [2.00, 0.30, 7.00, 7.00, 7.0],
    [3.00, 3.00, 3.00, 3.00, 3.0],
    [0.40, 1.00, 1.20, 0.90, 6.0],  # 1.0 sits exactly at the clip threshold: min(k, c) leaves it unchanged
    [0.70, 5.00, 5.00, 5.00, 5.0],
]
MASK = [
    [1, 1, 1, 1, 0],
    [1, 1, 0, 0, 0],
    [0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0],
    [1, 0, 0, 0, 0],
]
CLIP = 1.0
ADAPTED = [[min(k, CLIP) for k in row] for row in RAW]
HOST = [[k * 1.1 + 0.01 for k in row] for row in RAW]


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _moments(xs, ys):
    n = len(xs)
    return (
        n,
        math.fsum(xs),
        math.fsum(ys),
        math.fsum(x * x for x in xs),
        math.fsum(y * y for y in ys),
        math.fsum(x * y for x, y in zip(xs, ys)),
    )


def _per_sequence(raw, mask):
    """(L_i, mean raw KL of sequence i) for non-empty sequences, by explicit loops."""
    lengths, means = [], []
    for row, m in zip(raw, mask):
        length = sum(m)
        if length:
            lengths.append(float(length))
            means.append(sum(k for k, mi in zip(row, m) if mi) / length)
    return lengths, means


def _random_batch(rng, batch, width):
    lengths = rng.integers(0, width + 1, size=batch)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float64)
    raw = rng.exponential(scale=rng.uniform(0.05, 2.0), size=(batch, width)) * (1 + lengths[:, None] / width)
    return raw, np.minimum(raw, 0.5), mask


# --------------------------------------------------------------------------------------------------------------------
# kl_statistics
# --------------------------------------------------------------------------------------------------------------------


def test_stat_and_metric_names():
    assert len(STAT_NAMES) == len(set(STAT_NAMES)) == len(STAT_INDEX)
    assert set(METRIC_NAMES) == {
        "adaptive_kl/raw_kl",
        "adaptive_kl/adapted_kl",
        "adaptive_kl/current_beta",
        "adaptive_kl/beta_scale",
        "adaptive_kl/clip_fraction",
        "adaptive_kl/seq_kl",
        "adaptive_kl/kl_length_corr",
    }


def test_kl_statistics_match_explicit_sums():
    stats = kl_statistics(_t(RAW), _t(ADAPTED), _t(MASK), clip_threshold=CLIP, host_kl=_t(HOST))
    assert stats.shape == (len(STAT_NAMES),)
    assert stats.dtype == torch.float64

    tokens = raw_sum = adapted_sum = clipped = host_sum = 0.0
    for raw_row, ad_row, host_row, m_row in zip(RAW, ADAPTED, HOST, MASK):
        for k, f, h, m in zip(raw_row, ad_row, host_row, m_row):
            if m:
                tokens += 1
                raw_sum += k
                adapted_sum += f
                host_sum += h
                clipped += k > CLIP
    lengths, means = _per_sequence(RAW, MASK)
    n, sx, sy, sxx, syy, sxy = _moments(lengths, means)
    expected = {
        "tokens": tokens,
        "raw_kl": raw_sum,
        "adapted_kl": adapted_sum,
        "clipped": clipped,
        "host_kl": host_sum,
        "sequences": 5.0,  # the empty sequence counts as a sequence...
        "seq_kl": raw_sum,
        "corr_n": 4.0,  # ...but not as a correlation point
        "corr_x": sx,
        "corr_y": sy,
        "corr_xx": sxx,
        "corr_yy": syy,
        "corr_xy": sxy,
    }
    assert n == 4 and tokens == 10 and clipped == 3
    for name in STAT_NAMES:
        assert stats[STAT_INDEX[name]].item() == pytest.approx(expected[name], rel=1e-14, abs=1e-15), name


def test_kl_statistics_defaults():
    """No clip threshold: nothing is counted as clipped; no host_kl: TRL's `kl` is the raw estimate."""
    stats = kl_statistics(_t(RAW), _t(ADAPTED), _t(MASK))
    assert stats[STAT_INDEX["clipped"]].item() == 0.0
    assert stats[STAT_INDEX["host_kl"]].item() == stats[STAT_INDEX["raw_kl"]].item()


def test_kl_statistics_are_detached_float64_for_float32_inputs_with_grad():
    raw = torch.tensor(RAW, dtype=torch.float32, requires_grad=True)
    stats = kl_statistics(raw, raw.clamp(max=CLIP), torch.tensor(MASK), clip_threshold=CLIP)
    assert stats.dtype == torch.float64
    assert not stats.requires_grad


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(2, 12), st.integers(1, 11), st.integers(1, 8), st.integers(1, 8))
def test_statistics_of_two_halves_sum_to_statistics_of_whole(seed, batch, split, width_a, width_b):
    """Micro-batches padded to different widths: their statistics add up to those of the whole batch."""
    assume(split < batch)
    rng = np.random.default_rng(seed)
    width = max(width_a, width_b)
    raw, adapted, mask = _random_batch(rng, batch, width)
    mask[:split, width_a:] = 0  # the first micro-batch's tokens fit in width_a
    mask[split:, width_b:] = 0
    whole = kl_statistics(_t(raw), _t(adapted), _t(mask), clip_threshold=0.5)
    first = kl_statistics(
        _t(raw[:split, :width_a]), _t(adapted[:split, :width_a]), _t(mask[:split, :width_a]), clip_threshold=0.5
    )
    second = kl_statistics(
        _t(raw[split:, :width_b]), _t(adapted[split:, :width_b]), _t(mask[split:, :width_b]), clip_threshold=0.5
    )
    torch.testing.assert_close(first + second, whole, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(2, 12), st.integers(1, 11), st.integers(1, 8), st.integers(1, 8))
def test_statistics_of_concatenated_sequence_sums_are_those_of_the_whole_batch(seed, batch, split, width_a, width_b):
    """What a trainer keeps of each micro-batch, its `(5, B)` per-sequence sums, concatenated over micro-batches padded
    to different widths, gives the whole batch's statistics: to float64 rounding (a padded token adds an exact 0, but
    a sum over another width may group its terms otherwise), and to the bit where the widths are the whole batch's
    (the statistics are then computed from the same sums in the same order)."""
    assume(split < batch)
    rng = np.random.default_rng(seed)
    width = max(width_a, width_b)
    raw, adapted, mask = _random_batch(rng, batch, width)
    host = raw * 1.1 + 0.01
    mask[:split, width_a:] = 0
    mask[split:, width_b:] = 0
    parts = [(slice(None, split), width_a), (slice(split, None), width_b)]
    sums = [
        kl_sequence_sums(
            _t(raw[rows, :w]),
            _t(adapted[rows, :w]),
            _t(mask[rows, :w]),
            clip_threshold=0.5,
            host_kl=_t(host[rows, :w]),
        )
        for rows, w in parts
    ]
    assert [part.shape for part in sums] == [(5, split), (5, batch - split)]
    whole = kl_statistics(_t(raw), _t(adapted), _t(mask), clip_threshold=0.5, host_kl=_t(host))
    torch.testing.assert_close(statistics_of_sequences(torch.cat(sums, dim=1)), whole, rtol=1e-13, atol=1e-13)
    same_width = [
        kl_sequence_sums(_t(raw[rows]), _t(adapted[rows]), _t(mask[rows]), clip_threshold=0.5, host_kl=_t(host[rows]))
        for rows, _ in parts
    ]
    assert torch.equal(statistics_of_sequences(torch.cat(same_width, dim=1)), whole)
    # The first five statistics are the sums' totals: `host_kl_mean` reads them from either.
    assert torch.equal(
        sums[0].sum(-1),
        kl_statistics(
            *(_t(a[:split, :width_a]) for a in (raw, adapted, mask)),
            clip_threshold=0.5,
            host_kl=_t(host[:split, :width_a]),
        )[:5],
    )


# --------------------------------------------------------------------------------------------------------------------
# pearson_from_moments
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_pearson_matches_numpy_corrcoef(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 512, size=40).astype(float)
    y = 0.002 * x + rng.normal(scale=0.5, size=40) + 3.0
    assert pearson_from_moments(*_moments(x.tolist(), y.tolist())) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-10)


def test_pearson_of_exact_linear_relations_is_plus_or_minus_one():
    x = [1.0, 2.0, 5.0, 9.0]
    assert pearson_from_moments(*_moments(x, [3 * v + 1 for v in x])) == pytest.approx(1.0, abs=1e-12)
    assert pearson_from_moments(*_moments(x, [-0.5 * v + 7 for v in x])) == pytest.approx(-1.0, abs=1e-12)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(1, 512), st.floats(min_value=0.0, max_value=10.0, allow_subnormal=False)),
        min_size=2,
        max_size=60,
    )
)
def test_pearson_matches_corrcoef_on_length_kl_data(points):
    x = np.array([float(p[0]) for p in points])
    y = np.array([p[1] for p in points])
    assume(x.std() > 0.1 and y.std() > 1e-3)  # clear spread: the moment formula is well conditioned
    got = pearson_from_moments(*_moments(x.tolist(), y.tolist()))
    assert -1.0 <= got <= 1.0
    assert got == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-6)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)),
        min_size=0,
        max_size=30,
    )
)
def test_pearson_is_finite_and_bounded_for_any_points(points):
    got = pearson_from_moments(*_moments([p[0] for p in points], [p[1] for p in points]))
    assert math.isfinite(got) and -1.0 <= got <= 1.0


def test_pearson_is_zero_with_fewer_than_two_points():
    assert pearson_from_moments(0, 0.0, 0.0, 0.0, 0.0, 0.0) == 0.0
    assert pearson_from_moments(*_moments([3.0], [0.7])) == 0.0


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([4.0, 4.0, 4.0, 4.0], [0.1, 0.5, 0.2, 0.9]),  # all completions have the same length
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [0.1] * 7),  # constant KL (0.1 is inexact: variance rounds to ±tiny)
        ([17.0, 31.0, 5.0], [1 / 3] * 3),
        ([7.0] * 5, [2.0] * 5),
    ],
)
def test_pearson_is_zero_without_spread(x, y):
    assert pearson_from_moments(*_moments(x, y)) == 0.0


# --------------------------------------------------------------------------------------------------------------------
# kl_metrics
# --------------------------------------------------------------------------------------------------------------------


def test_kl_metrics_match_direct_computation():
    stats = kl_statistics(_t(RAW), _t(ADAPTED), _t(MASK), clip_threshold=CLIP, host_kl=_t(HOST))
    metrics = kl_metrics(stats, beta=0.037, beta_scale=0.5)
    assert set(metrics) == set(METRIC_NAMES)

    raw_tokens = [k for row, m in zip(RAW, MASK) for k, mi in zip(row, m) if mi]
    adapted_tokens = [f for row, m in zip(ADAPTED, MASK) for f, mi in zip(row, m) if mi]
    host_tokens = [h for row, m in zip(HOST, MASK) for h, mi in zip(row, m) if mi]
    seq_sums = [sum(k for k, mi in zip(row, m) if mi) for row, m in zip(RAW, MASK)]
    lengths, means = _per_sequence(RAW, MASK)

    assert metrics["adaptive_kl/raw_kl"] == pytest.approx(np.mean(raw_tokens), rel=1e-14)
    assert metrics["adaptive_kl/adapted_kl"] == pytest.approx(np.mean(adapted_tokens), rel=1e-14)
    assert metrics["adaptive_kl/clip_fraction"] == pytest.approx(np.mean([k > CLIP for k in raw_tokens]), rel=1e-14)
    assert metrics["adaptive_kl/seq_kl"] == pytest.approx(np.mean(seq_sums), rel=1e-14)
    assert metrics["adaptive_kl/kl_length_corr"] == pytest.approx(np.corrcoef(lengths, means)[0, 1], abs=1e-12)
    assert (stats[STAT_INDEX["host_kl"]] / max(stats[STAT_INDEX["tokens"]], 1.0)).item() == pytest.approx(
        np.mean(host_tokens), rel=1e-14
    )  # TRL's `kl` of the micro-batch
    assert metrics["adaptive_kl/current_beta"] == 0.037
    assert metrics["adaptive_kl/beta_scale"] == 0.5


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(3, 10), st.integers(1, 9))
def test_metrics_of_summed_halves_are_token_weighted_means_of_whole_batch(seed, batch, split):
    """Means over two micro-batches are token-weighted over the union, not an average of the two means."""
    assume(split < batch)
    rng = np.random.default_rng(seed)
    raw, adapted, mask = _random_batch(rng, batch, 7)
    parts = [slice(0, split), slice(split, batch)]
    stats = sum(kl_statistics(_t(raw[p]), _t(adapted[p]), _t(mask[p]), clip_threshold=0.5) for p in parts)
    metrics = kl_metrics(stats, beta=0.1, beta_scale=1.0)

    on = mask.astype(bool)
    assume(on.any())
    assert metrics["adaptive_kl/raw_kl"] == pytest.approx(raw[on].mean(), rel=1e-12)
    assert metrics["adaptive_kl/adapted_kl"] == pytest.approx(adapted[on].mean(), rel=1e-12)
    assert metrics["adaptive_kl/clip_fraction"] == pytest.approx((raw[on] > 0.5).mean(), rel=1e-12)
    assert metrics["adaptive_kl/seq_kl"] == pytest.approx((raw * mask).sum(1).mean(), rel=1e-12)
    lengths, means = _per_sequence(raw.tolist(), mask.tolist())
    if len(lengths) >= 2 and np.std(lengths) > 0 and np.std(means) > 1e-6 * np.mean(means):
        assert metrics["adaptive_kl/kl_length_corr"] == pytest.approx(np.corrcoef(lengths, means)[0, 1], abs=1e-9)


def test_kl_metrics_of_empty_statistics_are_zero_and_finite():
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    metrics = kl_metrics(stats, beta=0.2, beta_scale=1.0)
    for name, value in metrics.items():
        assert math.isfinite(value), name
    assert (
        metrics["adaptive_kl/raw_kl"]
        == metrics["adaptive_kl/kl_length_corr"]
        == (stats[STAT_INDEX["host_kl"]] / max(stats[STAT_INDEX["tokens"]], 1.0)).item()
        == 0.0
    )


@pytest.mark.parametrize("kl", [1 / 3, 2 / 3, 0.9, 0.1, 0.7])
def test_kl_length_corr_is_zero_for_constant_kl_despite_rounding(kl):
    """Constant per-token KL: the per-sequence means Σ/L_i differ only by an ulp between lengths; that is no spread."""
    lengths = [3, 7, 10, 13, 6]
    raw = [[kl] * 13 for _ in lengths]
    mask = [[1] * length + [0] * (13 - length) for length in lengths]
    metrics = kl_metrics(kl_statistics(_t(raw), _t(raw), _t(mask)), beta=0.1, beta_scale=1.0)
    assert metrics["adaptive_kl/kl_length_corr"] == 0.0


def test_kl_length_corr_detects_length_exploitation():
    """Longer completions with higher per-token KL give a strongly positive correlation; reversed, negative."""
    lengths = [2, 4, 6, 8]
    raw = [[0.1 * length] * 8 for length in lengths]
    mask = [[1] * length + [0] * (8 - length) for length in lengths]
    up = kl_metrics(kl_statistics(_t(raw), _t(raw), _t(mask)), beta=0.1, beta_scale=1.0)
    down = kl_metrics(kl_statistics(_t(raw[::-1]), _t(raw[::-1]), _t(mask)), beta=0.1, beta_scale=1.0)
    assert up["adaptive_kl/kl_length_corr"] == pytest.approx(1.0, abs=1e-12)
    assert down["adaptive_kl/kl_length_corr"] == pytest.approx(-1.0, abs=1e-12)
