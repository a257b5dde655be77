"""`diversity/*` metrics of a generation batch: hand-computed values, group boundaries, edge cases, the embedder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import REPO as ROOT

from adaptive_kl.metrics.diversity import (
    DIVERSITY_METRICS,
    HashedNgramEmbedder,
    distinct_n,
    diversity_metrics,
    mean_pairwise_cosine,
    unique_fraction,
)


SETTINGS = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------------------------------------------- unique_fraction


def test_unique_fraction_by_hand():
    group_1 = [[1, 2], [1, 2], [1, 2], [3]]  # 2 distinct of 4
    group_2 = [[5], [6], [7], [8]]  # 4 distinct of 4
    ids = group_1 + group_2
    assert unique_fraction(ids, 4) == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert unique_fraction(ids, 8) == pytest.approx(6 / 8)
    assert unique_fraction(ids, 1) == 1.0


def test_duplicate_across_groups_is_not_a_duplicate():
    ids = [[1, 2], [3], [1, 2], [4]]  # [1, 2] answers both prompts, once each
    assert unique_fraction(ids, 2) == 1.0
    assert unique_fraction(ids, 4) == 0.75  # the same batch as one group does see it


def test_unique_fraction_compares_whole_sequences():
    # A prefix, a permutation and an extra EOS are all different completions.
    assert unique_fraction([[1, 2], [1, 2, 3], [2, 1], [1, 2, 0]], 4) == 1.0
    assert unique_fraction([[], [], [7], []], 4) == 0.5  # empty completions are equal to each other


def test_unique_fraction_accepts_tensor_rows():
    ids = [torch.tensor([1, 2]), torch.tensor([1, 2])]  # would be two distinct objects if hashed by identity
    assert unique_fraction(ids, 2) == 0.5


# ---------------------------------------------------------------------------------------------------------- distinct_n


def test_distinct_n_by_hand():
    ids = [[1, 2, 1, 2], [1, 2, 3]] + [[4, 4], [4]]  # two groups of two
    # Group 1: unigrams {1, 2, 3} of 7; bigrams {(1,2), (2,1), (2,3)} of 3 + 2 = 5.
    # Group 2: unigrams {4} of 3; bigrams {(4,4)} of 1 (the one-token completion has none).
    assert distinct_n(ids, 2, 1) == pytest.approx((3 / 7 + 1 / 3) / 2)
    assert distinct_n(ids, 2, 2) == pytest.approx((3 / 5 + 1 / 1) / 2)
    # Trigrams: group 1 has (1,2,1), (2,1,2), (1,2,3), all distinct; group 2 has none and is left out.
    assert distinct_n(ids, 2, 3) == 1.0


def test_distinct_n_does_not_cross_completions_or_groups():
    # Token 2 ending the first completion and 3 starting the second never form the bigram (2, 3).
    assert distinct_n([[1, 2], [3, 4]], 2, 2) == 1.0
    assert distinct_n([[1, 2], [2, 3]], 2, 2) == 1.0
    # The same bigram in two groups counts once in each: both groups are fully distinct.
    assert distinct_n([[1, 2], [3, 4], [1, 2], [5, 6]], 2, 2) == 1.0
    assert distinct_n([[1, 2], [3, 4], [1, 2], [5, 6]], 4, 2) == 0.75


def test_distinct_n_is_nan_without_any_ngram():
    assert math.isnan(distinct_n([[1], [], [2], [3]], 2, 2))
    assert math.isnan(distinct_n([[], []], 2, 1))
    assert math.isnan(distinct_n([], 2, 1))


@pytest.mark.parametrize("n", [0, -1, 1.0, True])
def test_distinct_n_rejects_bad_n(n):
    with pytest.raises(ValueError, match="n must be a positive integer"):
        distinct_n([[1, 2]], 1, n)


@SETTINGS
@given(
    st.integers(1, 4).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=g, max_size=3 * g).map(
                lambda xs: xs[: len(xs) - len(xs) % g]
            ),
        )
    ),
    st.integers(1, 3),
)
def test_token_metrics_match_brute_force(group_and_ids, n):
    g, ids = group_and_ids
    groups = [ids[k : k + g] for k in range(0, len(ids), g)]
    fractions = [len({tuple(c) for c in grp}) / g for grp in groups]
    assert unique_fraction(ids, g) == pytest.approx(sum(fractions) / len(fractions))
    ratios = []
    for grp in groups:
        grams = [tuple(c[i : i + n]) for c in grp for i in range(len(c) - n + 1)]
        if grams:
            ratios.append(len(set(grams)) / len(grams))
    expected = sum(ratios) / len(ratios) if ratios else math.nan
    assert distinct_n(ids, g, n) == pytest.approx(expected, nan_ok=True)
    assert math.isnan(expected) or 0 < expected <= 1


# ------------------------------------------------------------------------------------------------ mean_pairwise_cosine


def test_cosine_identical_orthogonal_opposite():
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])
    assert mean_pairwise_cosine(torch.stack([e1, 2 * e1, 5 * e1]), 3) == pytest.approx(1.0)
    assert mean_pairwise_cosine(torch.stack([e1, e2]), 2) == pytest.approx(0.0)
    assert mean_pairwise_cosine(torch.stack([e1, -4 * e1]), 2) == pytest.approx(-1.0)
    # Groups (identical, orthogonal, opposite) average to 0.
    batch = torch.stack([e1, e1, e1, e2, e1, -e1])
    assert mean_pairwise_cosine(batch, 2) == pytest.approx(0.0, abs=1e-7)


def test_cosine_by_hand_over_unordered_pairs():
    # Pairs (0,1): 1, (0,2): 0, (1,2): 0 -> 1/3 (ordered pairs or the diagonal would give other values).
    e = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    assert mean_pairwise_cosine(e, 3) == pytest.approx(1 / 3)
    # The mean is over groups, not over all pairs: groups of 1/3 and -1 give -1/3.
    batch = torch.cat([e, torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]])])
    # Group 2 pairs: (0,1): -1, (0,2): -1, (1,2): 1 -> -1/3. Mean of 1/3 and -1/3.
    assert mean_pairwise_cosine(batch, 3) == pytest.approx(0.0, abs=1e-7)
    assert mean_pairwise_cosine(batch[[0, 1, 2, 3, 4, 5]], 6) != pytest.approx(0.0)


def test_cosine_does_not_pair_across_groups():
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert mean_pairwise_cosine(torch.stack([e1, e2, e1, e2]), 2) == pytest.approx(0.0)
    assert mean_pairwise_cosine(torch.stack([e1, e2, e1, e2]), 4) == pytest.approx(2 / 6)
    # Groups are consecutive rows, also of a non-contiguous tensor: rows (1,0), (1,1) | (1,0), (−1,0).
    columns = torch.tensor([[1.0, 1.0, 1.0, -1.0], [0.0, 1.0, 0.0, 0.0]])
    assert not columns.T.is_contiguous()
    assert mean_pairwise_cosine(columns.T, 2) == pytest.approx((2**-0.5 - 1) / 2)


def test_cosine_with_zero_vectors_is_zero_not_nan():
    e = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    assert mean_pairwise_cosine(e, 3) == pytest.approx(1 / 3)  # pairs: 0, 0, 1
    assert mean_pairwise_cosine(torch.zeros(4, 3), 2) == 0.0
    assert mean_pairwise_cosine(torch.zeros(4, 3, dtype=torch.float16), 4) == 0.0


def test_cosine_is_nan_only_without_pairs():
    assert math.isnan(mean_pairwise_cosine(torch.randn(5, 3), 1))
    assert math.isnan(mean_pairwise_cosine(torch.zeros(0, 3), 2))
    assert math.isfinite(mean_pairwise_cosine(torch.randn(2, 3), 2))


def test_cosine_accepts_half_precision_and_stays_in_range():
    e = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    assert mean_pairwise_cosine(e, 2) == pytest.approx(1.0, abs=1e-6)
    # Norms that would overflow or underflow float32 still give the cosine of the directions.
    huge = torch.full((2, 1000), 1e30)
    small = torch.tensor([[3e-30, 0.0, 4e-30], [3.0, 0.0, 4.0]])
    assert mean_pairwise_cosine(huge, 2) == pytest.approx(1.0)
    assert mean_pairwise_cosine(small, 2) == pytest.approx(1.0)


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_cosine_matches_a_loop(g, num_groups, d, seed):
    e = torch.randn(g * num_groups, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    e[::3] = 0.0  # some zero vectors
    means = []
    for k in range(num_groups):
        grp = e[k * g : (k + 1) * g]
        sims = [
            0.0 if grp[i].norm() == 0 or grp[j].norm() == 0 else float(grp[i] @ grp[j] / grp[i].norm() / grp[j].norm())
            for i in range(g)
            for j in range(i + 1, g)
        ]
        if sims:
            means.append(sum(sims) / len(sims))
    expected = sum(means) / len(means) if means else math.nan
    assert mean_pairwise_cosine(e, g) == pytest.approx(expected, abs=1e-6, nan_ok=True)


def test_cosine_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        mean_pairwise_cosine(torch.zeros(4), 2)
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        mean_pairwise_cosine(torch.zeros(4, 0), 2)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        mean_pairwise_cosine(torch.zeros(3, 2), 2)


# ------------------------------------------------------------------------------------------------- HashedNgramEmbedder


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / a.norm() / b.norm())


def test_embedder_counts_every_ngram_once():
    embed = HashedNgramEmbedder(n=3, dim=64)
    texts = ["hello world", "ab", "", "abc", "aaaaa", "héllo ✓ 日本語"]
    e = embed(texts)
    assert e.shape == (6, 64) and e.dtype == torch.float32
    # len − n + 1 n-grams, and one (padded) n-gram for texts shorter than n.
    assert e.sum(-1).tolist() == [9, 1, 1, 1, 3, 9]
    assert e[4].max() == 3  # "aaa" three times, in one bucket


def test_embedder_is_a_sum_of_its_ngrams_and_texts_do_not_interact():
    embed = HashedNgramEmbedder(n=3, dim=1024)
    texts = ["the cat sat", "on the mat", "xy", "", "the cat sat"]
    batch = embed(texts)
    for text, row in zip(texts, batch):
        assert torch.equal(embed([text])[0], row)  # no window across two texts of the batch
        grams = [text[i : i + 3] for i in range(len(text) - 2)] or [text.ljust(3, "\0")]
        assert torch.equal(embed(grams).sum(0), row)
        # Each n-gram alone is one count in one bucket.
        assert (embed(grams).sum(-1) == 1).all()


def test_embedder_cosine_is_lexical_overlap():
    embed = HashedNgramEmbedder()
    e = embed(["the same text", "the same text", "aaaa", "bbbb", "", "", "abcd", "xyz"])
    assert _cos(e[0], e[1]) == pytest.approx(1.0)
    assert _cos(e[2], e[3]) == 0.0  # disjoint characters: no common n-gram
    assert _cos(e[4], e[5]) == pytest.approx(1.0)  # two empty completions are identical, not zero vectors
    assert _cos(e[6], e[7]) == 0.0
    assert 0 < _cos(e[0], embed(["the same thing"])[0]) < 1


def test_embedder_empty_batch_and_validation():
    assert HashedNgramEmbedder(dim=16)([]).shape == (0, 16)
    for kwargs in ({"n": 0}, {"dim": 0}, {"n": 2.0}):
        with pytest.raises(ValueError, match="must be a positive integer"):
            HashedNgramEmbedder(**kwargs)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])  # n ≥ 4 reduces modulo the prime inside the polynomial
def test_embedder_other_ngram_sizes(n):
    embed = HashedNgramEmbedder(n=n, dim=4096)
    texts = ["abcdefghijklmnop", "abcdefghijklmnop", "", "qrstuvwxyz"]
    e = embed(texts)
    assert e.sum(-1).tolist() == [max(len(t) - n + 1, 1) for t in texts]
    assert torch.equal(e[0], e[1]) and _cos(e[0], e[3]) == 0.0


STABILITY_TEXTS = ["the cat sat on the mat", "", "a", "héllo ✓ 日本語", "x" * 50]
STABILITY_SCRIPT = (
    "import json, sys; from adaptive_kl.metrics.diversity import HashedNgramEmbedder as E; "
    "e = E()(json.loads(sys.argv[1])); print(json.dumps(e.nonzero().tolist() + e[e != 0].tolist()))"
)


def _embedding_signature(e: torch.Tensor) -> list:
    return json.loads(json.dumps(e.nonzero().tolist() + e[e != 0].tolist()))


def test_embedder_is_stable_across_calls_and_processes():
    embed = HashedNgramEmbedder()
    here = embed(STABILITY_TEXTS)
    assert torch.equal(here, HashedNgramEmbedder()(STABILITY_TEXTS))
    assert torch.equal(here, embed(list(STABILITY_TEXTS)))
    for seed in ("0", "12345"):  # Python's str hash differs with the seed: the embedding must not
        result = subprocess.run(
            [sys.executable, "-c", STABILITY_SCRIPT, json.dumps(STABILITY_TEXTS)],
            check=False,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert json.loads(result.stdout) == _embedding_signature(here)


# --------------------------------------------------------------------------------------------------- diversity_metrics


def test_diversity_metrics_by_hand():
    ids = [[1, 2, 3], [1, 2, 3], [4], [5]]
    texts = ["abc", "abc", "xxxx", "yyyy"]
    metrics = diversity_metrics(ids, texts, 2)
    assert list(metrics) == list(DIVERSITY_METRICS)
    assert metrics["diversity/unique_fraction"] == 0.75
    assert metrics["diversity/distinct_1"] == pytest.approx((3 / 6 + 2 / 2) / 2)
    assert metrics["diversity/distinct_2"] == pytest.approx(2 / 4)  # group 2 has no bigram
    assert metrics["diversity/embedding_similarity"] == pytest.approx((1.0 + 0.0) / 2)


def test_diversity_metrics_other_ngram_sizes():
    metrics = diversity_metrics([[1, 1, 1], [1, 1, 1]], ["a", "a"], 2, ngram_sizes=(3, 1))
    assert list(metrics) == [
        "diversity/unique_fraction",
        "diversity/distinct_3",
        "diversity/distinct_1",
        "diversity/embedding_similarity",
    ]
    assert metrics["diversity/distinct_3"] == 0.5 and metrics["diversity/distinct_1"] == 1 / 6


def test_diversity_metrics_uses_a_custom_embedder():
    calls = []

    def embedder(completions):
        calls.append(list(completions))
        return torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])

    texts = ["a", "b", "c", "d"]
    metrics = diversity_metrics([[1], [2], [3], [4]], texts, 2, embedder=embedder)
    assert calls == [texts]
    assert metrics["diversity/embedding_similarity"] == pytest.approx((-1.0 + 1.0) / 2)
    # A numpy-returning embedder (sentence-transformers' default) works too.
    metrics = diversity_metrics([[1], [2]], ["a", "b"], 2, embedder=lambda t: torch.ones(2, 3).numpy())
    assert metrics["diversity/embedding_similarity"] == pytest.approx(1.0)


def test_diversity_metrics_empty_completions():
    metrics = diversity_metrics([[], [], [], [7]], ["", "", "", "ok"], 2)
    assert metrics["diversity/unique_fraction"] == 0.75
    assert metrics["diversity/distinct_1"] == 1.0  # only group 2 has a token
    assert math.isnan(metrics["diversity/distinct_2"])
    # Group 1: two empty texts are identical (1); group 2: empty vs "ok" share nothing (0).
    assert metrics["diversity/embedding_similarity"] == pytest.approx(0.5)


def test_diversity_metrics_without_pairs_does_not_embed():
    def embedder(completions):
        raise AssertionError("called")

    metrics = diversity_metrics([[1], [2]], ["a", "b"], 1, embedder=embedder)
    assert metrics["diversity/unique_fraction"] == 1.0 and math.isnan(metrics["diversity/embedding_similarity"])
    metrics = diversity_metrics([], [], 4, embedder=embedder)
    assert all(math.isnan(v) for v in metrics.values())


@pytest.mark.parametrize(
    "ids, texts, g, match",
    [
        ([[1], [2]], ["a"], 2, "same length"),
        ([[1], [2], [3]], ["a", "b", "c"], 2, r"\(3\) must be a multiple of num_generations \(2\)"),
        ([[1]], ["a"], 0, "num_generations must be a positive integer"),
        ([[1]], ["a"], 1.0, "num_generations must be a positive integer"),
    ],
)
def test_diversity_metrics_validates_inputs(ids, texts, g, match):
    with pytest.raises(ValueError, match=match):
        diversity_metrics(ids, texts, g)


def test_diversity_metrics_rejects_a_wrong_embedding_shape():
    with pytest.raises(ValueError, match="one row per completion"):
        diversity_metrics([[1], [2]], ["a", "b"], 2, embedder=lambda t: torch.zeros(3, 4))
    with pytest.raises(ValueError, match="one row per completion"):
        diversity_metrics([[1], [2]], ["a", "b"], 2, embedder=lambda t: torch.zeros(2))


def test_cost_benchmark_runs(tmp_path):
    output = tmp_path / "diversity.md"
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "diversity_cost.py"), "--batches", "16x8,8x4"]
        + ["--num-generations", "4", "--min-run-time", "0.01", "--step-time-ms", "100,-", "--output", str(output)],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    rows = [line for line in output.read_text().splitlines() if line.startswith(("| 16 × 8", "| 8 × 4"))]
    assert len(rows) == 2
    total = float(rows[0].split("|")[8])
    assert math.isfinite(total) and total > 0
    assert rows[0].rstrip("| ").endswith("%") and rows[1].split("|")[-2].strip() == "–"
