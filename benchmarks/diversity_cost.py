"""Micro-benchmark: the cost of the `diversity/*` metrics per generation batch.

    python benchmarks/diversity_cost.py                              # 64 × 24 (embedded demo) and 256 × 256
    python benchmarks/diversity_cost.py --step-time-ms 56.8,- --output benchmarks/results/cpu-diversity-cost.md
    python benchmarks/diversity_cost.py --embedder minilm --step-time-ms 56.8,- \
        --output benchmarks/results/cpu-diversity-cost-minilm.md          # all-MiniLM-L6-v2 (the diversity extra)

Times `adaptive_kl.metrics.diversity.diversity_metrics` with an embedder (`--embedder`: the default
`HashedNgramEmbedder`, or a `diversity_embedder` name such as `minilm`, run on the CPU) on synthetic generation
batches of N completions of T tokens in groups of G, and each of its parts alone. Completions of a group are
variations of one base completion (a fraction `--overlap` of the tokens kept), and tokens decode to words of 1 to
6 letters, as a BPE vocabulary does. Medians of `torch.utils.benchmark`; prints, and with `--output` writes, a
markdown table. With `--step-time-ms` (one value, or one per batch with `-` for none), the total is also given as
a share of that training step time.
"""

from __future__ import annotations

import argparse
import sys

import torch
from machine import report
from torch.utils import benchmark

from adaptive_kl.metrics.diversity import (
    HashedNgramEmbedder,
    distinct_n,
    diversity_metrics,
    mean_pairwise_cosine,
    unique_fraction,
)


def synthetic_batch(
    num_completions: int, length: int, num_generations: int, vocab_size: int, overlap: float, seed: int
) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of `num_completions` completions of `length` tokens, in groups of similar ones."""
    g = torch.Generator().manual_seed(seed)
    letters = torch.randint(0, 26, (vocab_size, 6), generator=g)
    word_lengths = torch.randint(1, 7, (vocab_size,), generator=g)
    vocab = [" " + "".join(chr(97 + c) for c in row[:k]) for row, k in zip(letters.tolist(), word_lengths.tolist())]
    num_groups = num_completions // num_generations
    base = torch.randint(0, vocab_size, (num_groups, 1, length), generator=g)
    fresh = torch.randint(0, vocab_size, (num_groups, num_generations, length), generator=g)
    keep = torch.rand(num_groups, num_generations, length, generator=g) < overlap
    ids = torch.where(keep, base, fresh).view(num_completions, length).tolist()
    return ids, ["".join(vocab[t] for t in row) for row in ids]


def median_seconds(fn, min_run_time: float) -> float:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def make_embedder(name: str):
    """`"hashed"`: the default `HashedNgramEmbedder`; else a `diversity_embedder` name (`"minilm"`, a path)."""
    if name == "hashed":
        return HashedNgramEmbedder()
    from adaptive_kl.trainers.embedding import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(name, device="cpu")


def measure(ids, texts, num_generations: int, min_run_time: float, embedder) -> dict[str, float]:
    embeddings = embedder(texts)
    parts = {
        "unique": lambda: unique_fraction(ids, num_generations),
        "distinct": lambda: [distinct_n(ids, num_generations, n) for n in (1, 2)],
        "embed": lambda: embedder(texts),
        "cosine": lambda: mean_pairwise_cosine(embeddings, num_generations),
        "total": lambda: diversity_metrics(ids, texts, num_generations, embedder=embedder),
    }
    return {name: median_seconds(fn, min_run_time) for name, fn in parts.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--batches", default="64x24,256x256", help="comma-separated N x T: completions x tokens")
    parser.add_argument("--num-generations", type=int, default=8, help="group size G")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--overlap", type=float, default=0.5, help="fraction of a group's base completion kept")
    parser.add_argument(
        "--step-time-ms", help="training step time(s) to compare the total with: one, or one per batch ('-': none)"
    )
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--embedder", default="hashed", help="'hashed' (default), 'minilm' (the diversity extra) or a model path"
    )
    parser.add_argument("--output", help="also write the results to this markdown file")
    opts = parser.parse_args(argv)

    header = "| N × T | G | chars/completion | unique (ms) | distinct-1,2 (ms) | embed (ms) | cosine (ms) |"
    header += " total (ms) | µs/token |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if opts.step_time_ms is not None:
        header += " share of step |"
        rule += "---|"
    lines = [header, rule]
    batches = opts.batches.split(",")
    step_times = [None] * len(batches)
    if opts.step_time_ms is not None:
        values = [None if v.strip() == "-" else float(v) for v in opts.step_time_ms.split(",")]
        if len(values) not in (1, len(batches)):
            parser.error(f"--step-time-ms needs one value or one per batch ({len(batches)})")
        step_times = values * len(batches) if len(values) == 1 else values
    embedder = make_embedder(opts.embedder)
    for spec, step_time in zip(batches, step_times):
        num_completions, length = (int(x) for x in spec.lower().split("x"))
        ids, texts = synthetic_batch(
            num_completions, length, opts.num_generations, opts.vocab_size, opts.overlap, opts.seed
        )
        measured = measure(ids, texts, opts.num_generations, opts.min_run_time, embedder)
        t = {k: v * 1e3 for k, v in measured.items()}
        chars = sum(map(len, texts)) / num_completions
        row = (
            f"| {num_completions} × {length} | {opts.num_generations} | {chars:.0f} | {t['unique']:.3f} "
            f"| {t['distinct']:.3f} | {t['embed']:.3f} | {t['cosine']:.3f} | {t['total']:.3f} "
            f"| {t['total'] * 1e3 / (num_completions * length):.2f} |"
        )
        if opts.step_time_ms is not None:
            row += " – |" if step_time is None else f" {100 * t['total'] / step_time:.2g}% |"
        lines.append(row)
        print(f"{num_completions} x {length} done", file=sys.stderr, flush=True)

    settings = (
        f"- settings: embedder {embedder!r}, distinct-n for n = 1, 2, vocabulary "
        f"{opts.vocab_size}, overlap {opts.overlap}, torch threads {torch.get_num_threads()}"
    )
    details = [settings]
    if opts.step_time_ms is not None:
        details.append(f"- step time(s) for the share, in ms: {opts.step_time_ms}")
    report("diversity_cost.py", argv, details, lines, opts.output)


if __name__ == "__main__":
    main()
