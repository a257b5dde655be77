"""Micro-benchmark: the adapted KL term alone vs the policy's forward and backward pass on the same tokens.

    python benchmarks/kl_term.py                          # CPU: the 30M model, 8 sequences of 32 to 1024 tokens
    python benchmarks/kl_term.py --shape qwen2.5-0.5b --bf16 --lengths 256,1024   # GPU

Times forward + backward of `adaptive_kl.kl.term.kl_term_and_sequence_sums` (the function the trainer calls:
estimate, transform, aggregation and the per-sequence sums of the metric statistics) for each method, next to the k3
term that stock TRL computes inline, and next to forward + backward of the model computing per-token log-probabilities
of the same (B, T) tokens. Medians of `torch.utils.benchmark`; prints, and with `--output` writes, a markdown table.
"""

from __future__ import annotations

import argparse
import sys

import torch
from machine import report
from torch.utils import benchmark

from adaptive_kl.kl.term import kl_term_and_sequence_sums
from adaptive_kl.testing.tiny_model import MODEL_SHAPES, build_model, build_tokenizer


# Term settings of each method (dynamic and kl_scaling only change the Python float β: same term as "none").
TERMS = {
    "none": {},
    "clip": {"transform": "clip"},
    "sigmoid": {"transform": "sigmoid"},
    "length_normalized": {"length_normalized": True},
}


def stock_k3_term(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What the host computes for its own KL at method "none": k3 per token, sequence means, batch mean."""
    log_ratio = ref_logps - logps
    per_token = torch.exp(log_ratio) - log_ratio - 1
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def policy_logps(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token log-probabilities of the given tokens (the quantity the KL term consumes)."""
    logits = model(input_ids=input_ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def median_seconds(fn, min_run_time: float) -> float:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def measure(model, batch: int, length: int, dtype: torch.dtype, device: str, min_run_time: float) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (batch, length + 1), generator=g).to(device)
    base = (-5 + torch.randn(batch, length, generator=g)).to(device, dtype)
    ref = (base + 0.1 * torch.randn(batch, length, generator=g).to(device, dtype)).detach()
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).to(device, dtype)

    def forward_backward(loss_fn):
        def step():
            logps = base.detach().requires_grad_()
            loss_fn(logps).backward()

        return step

    def model_step():
        model.zero_grad(set_to_none=True)
        policy_logps(model, input_ids).mean().backward()

    times = {"policy forward + backward": median_seconds(model_step, min_run_time)}
    stock = forward_backward(lambda x: stock_k3_term(x, ref, mask))
    times["stock TRL k3 (inline)"] = median_seconds(stock, min_run_time)
    for name, settings in TERMS.items():
        ours = forward_backward(lambda x, settings=settings: kl_term_and_sequence_sums(x, ref, mask, **settings)[0])
        times[name] = median_seconds(ours, min_run_time)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--shape", default="small-30m", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", default="32,256,1024", help="comma-separated completion lengths T")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    parser.add_argument("--output", help="also write the results to this markdown file")
    opts = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if opts.bf16 else torch.float32
    tokenizer = build_tokenizer(MODEL_SHAPES[opts.shape].get("vocab_size"))
    model = build_model(tokenizer, opts.shape).to(device, dtype)
    params = sum(p.numel() for p in model.parameters()) / 1e6

    lines = [
        "| B × T | policy fwd+bwd (ms) | term | term fwd+bwd (µs) | ns/token | share of policy fwd+bwd |",
        "|---|---|---|---|---|---|",
    ]
    for length in (int(x) for x in opts.lengths.split(",")):
        times = measure(model, opts.batch, length, dtype, device, opts.min_run_time)
        policy = times.pop("policy forward + backward")
        for name, seconds in times.items():
            lines.append(
                f"| {opts.batch} × {length} | {policy * 1e3:.1f} | {name} | {seconds * 1e6:.0f} "
                f"| {seconds * 1e9 / (opts.batch * length):.1f} | {100 * seconds / policy:.2g}% |"
            )
        print(f"{opts.batch} x {length} done", file=sys.stderr, flush=True)

    settings = f"- settings: shape {opts.shape} ({params:.2g}M parameters), dtype {dtype}, batch {opts.batch}"
    report("kl_term.py", argv, [settings], lines, opts.output)


if __name__ == "__main__":
    main()
