"""Soak: long runs of every KL method on the tiny model, checked for non-finite values and resident-memory growth.

    python benchmarks/soak.py                                    # 300 steps of each method; exit status 1 on failure
    python benchmarks/soak.py --steps 1000 --methods dynamic,clip

Each method trains the random tiny model (`adaptive_kl.testing.tiny_model`) with AdaptiveKLGRPOTrainer for `--steps`
optimizer steps at β = `--beta`, logging every step, on a reward that varies within every group (the fraction of
digits in a completion), so that advantages, and with them the policy and its KL to the reference, keep moving.
`dynamic` gets a `reward_threshold` that the reward reaches during the run, so that its β actually decays. A control
row, "stock (beta=0)", trains the same way with method "none" at β = 0, which is stock TRL's code path: memory growth
that it shows too is not ours.

Non-finite values: every number in every log of the run (the loss, TRL's metrics and the `adaptive_kl/*` ones,
among them the β of each step) and in the β controller's final `state_dict()` is checked; NaN and ±inf are counted.

Memory: the process's resident set (VmRSS; on a GPU, `torch.cuda.memory_allocated`) is sampled at the end of every
optimizer step. glibc is set to return freed blocks of 64 KiB or more to the system (`machine.precise_cpu_memory`),
so that RSS follows live memory rather than the allocator's caching. After `--warmup` steps and after the last step,
garbage is collected and freed memory trimmed before the sample (`machine.reset_peak_memory`). Growth is
end / after-warm-up − 1; "max growth" is the highest step-end sample after warm-up (no collection before those)
over the after-warm-up one, − 1. A run passes when it has no non-finite value and its growth is below
`--max-growth` (5%).

Prints, and with `--output` writes, a markdown table; exits with status 1 if any row fails. Not a timing benchmark.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import time

import torch
from datasets import Dataset
from machine import current_memory_mib, precise_cpu_memory, report, reset_peak_memory
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.testing.tiny_model import save_random_model
from adaptive_kl.trainers.config import KL_METHODS
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


STOCK = "stock (beta=0)"  # method "none" at β = 0: the trainer runs stock TRL's loss (the control row)


def digit_reward(completions, **kwargs):
    """The fraction of a completion's characters that are digits: varies within a group, and can be learned."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


class StepMemory(TrainerCallback):
    """Samples memory at the end of every optimizer step; collects and trims first after warm-up and at the end."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.samples: list[float] = []  # one per step, in order
        self.after_warmup = self.at_end = float("nan")

    def on_step_end(self, args, state, control, **kwargs):
        settle = state.global_step in (self.warmup, state.max_steps)
        if settle:
            reset_peak_memory()  # gc.collect() and malloc_trim(0) (its peak-window reset is not used here)
        rss = current_memory_mib()
        self.samples.append(rss)
        if state.global_step == self.warmup:
            self.after_warmup = rss
        if state.global_step == state.max_steps:
            self.at_end = rss


def build_trainer(method: str, beta: float, model_dir: str, opts):
    fields = dict(kl_adaptation_method=method)
    if method == "dynamic":
        fields.update(reward_threshold=opts.reward_threshold)
    args = AdaptiveKLGRPOConfig(
        output_dir=tempfile.mkdtemp(),
        beta=beta,
        max_steps=opts.steps,
        per_device_train_batch_size=opts.batch,
        num_generations=opts.num_generations,
        max_completion_length=opts.completion_length,
        learning_rate=opts.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=not torch.cuda.is_available(),
        **fields,
    )
    trainer = AdaptiveKLGRPOTrainer(
        model=model_dir,
        reward_funcs=[digit_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(32) for b in range(8)]}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.remove_callback(PrinterCallback)  # the log lines of `disable_tqdm`
    return trainer


def non_finite(values: dict, where: str) -> list[str]:
    """`where:key=value` for every number in `values` that is NaN or ±inf."""
    return [
        f"{where}:{key}={value}"
        for key, value in values.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value)
    ]


def soak(label: str, method: str, beta: float, model_dir: str, opts) -> dict:
    """Trains one method for `opts.steps` steps; its step logs, non-finite values, β and memory samples."""
    trainer = build_trainer(method, beta, model_dir, opts)
    memory = StepMemory(opts.warmup)
    trainer.add_callback(memory)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    history = trainer.state.log_history
    steps = [log for log in history if "loss" in log]  # one per optimizer step (logging_steps=1)
    controller = trainer.beta_controller.state_dict()
    bad = [item for i, log in enumerate(history) for item in non_finite(log, f"log {i}")]
    bad += non_finite(controller, "controller")
    betas = [log.get("adaptive_kl/current_beta", beta) for log in steps]  # β of each step (stock: none logged)
    result = {
        "label": label,
        "steps": trainer.state.global_step,
        "logged_steps": len(steps),
        "non_finite": bad,
        "final_beta": betas[-1] if betas else float("nan"),
        "decays": controller["num_decays"],
        "mean_reward": [log["reward"] for log in steps if "reward" in log],
        "after_warmup": memory.after_warmup,
        "at_end": memory.at_end,
        "max_after_warmup": max(memory.samples[opts.warmup :], default=float("nan")),
        "seconds": seconds,
    }
    del trainer
    gc.collect()
    return result


def verdict(result: dict, max_growth: float) -> tuple[float, float, str]:
    """Growth, max growth and the pass cell of one row."""
    growth = result["at_end"] / result["after_warmup"] - 1
    max_growth_seen = result["max_after_warmup"] / result["after_warmup"] - 1
    failures = []
    if result["non_finite"]:
        failures.append("non-finite")
    if not growth < max_growth:  # NaN fails too
        failures.append(f"growth ≥ {max_growth:.0%}")
    if result["steps"] != result["logged_steps"]:
        failures.append("steps missing from the logs")
    return growth, max_growth_seen, "yes" if not failures else "**no**: " + ", ".join(failures)


def summarize(results: list[dict], max_growth: float, memory_name: str) -> tuple[list[str], bool]:
    """The markdown table, and whether every row passed."""
    lines = [
        f"| method | steps | non-finite values | final β | {memory_name} after warm-up (MiB) "
        f"| {memory_name} at end (MiB) | growth | max growth | pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    passed = True
    for r in results:
        growth, max_growth_seen, cell = verdict(r, max_growth)
        passed &= cell == "yes"
        lines.append(
            f"| {r['label']} | {r['steps']} | {len(r['non_finite'])} | {r['final_beta']:.4g} "
            f"| {r['after_warmup']:.1f} | {r['at_end']:.1f} | {growth:+.2%} | {max_growth_seen:+.2%} | {cell} |"
        )
    return lines, passed


def details(results: list[dict], opts) -> list[str]:
    """Per-row lines: run time, reward, β decays, and the first non-finite values if any."""
    lines = []
    for r in results:
        rewards = r["mean_reward"] or [float("nan")]
        head, tail = rewards[: opts.warmup], rewards[-opts.warmup :]
        line = (
            f"- {r['label']}: {r['seconds']:.0f} s ({r['seconds'] / max(r['steps'], 1):.2f} s/step); mean reward "
            f"{statistics.fmean(head):.3f} over the first {len(head)} steps, {statistics.fmean(tail):.3f} over the "
            f"last {len(tail)}"
        )
        if r["label"] == "dynamic":
            line += f"; β decayed in {r['decays']} steps"
        if r["non_finite"]:
            line += f"; non-finite: {', '.join(r['non_finite'][:5])}" + (" …" if len(r["non_finite"]) > 5 else "")
        lines.append(line)
    return lines


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per method")
    parser.add_argument("--warmup", type=int, default=50, help="steps before the reference memory sample")
    parser.add_argument("--methods", default=",".join(KL_METHODS), help="comma-separated kl_adaptation_method values")
    parser.add_argument("--beta", type=float, default=0.1, help="β of every method (the control row has 0)")
    parser.add_argument("--reward-threshold", type=float, default=0.25, help="dynamic: mean reward that decays β")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=8, help="per-device batch (completions per optimizer step)")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--max-growth", type=float, default=0.05, help="a row fails at this memory growth or more")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--output", help="also write the results to this markdown file")
    opts = parser.parse_args(argv)
    if not 0 < opts.warmup < opts.steps:
        parser.error(f"--warmup ({opts.warmup}) must be positive and smaller than --steps ({opts.steps}).")
    if opts.beta <= 0:
        parser.error(f"--beta must be positive, got {opts.beta}.")
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    if not torch.cuda.is_available():
        precise_cpu_memory()  # first: every later allocation is made in this mode
    scorer_note = install_cpu_scorer_if_needed()  # TRL 1.15 on a CPU
    model_dir = save_random_model(tempfile.mkdtemp(), "tiny")
    runs = [(STOCK, "none", 0.0)] + [(m, m, opts.beta) for m in opts.methods.split(",")]
    results = []
    for label, method, beta in runs:
        results.append(soak(label, method, beta, model_dir, opts))
        print(f"{label}: done in {results[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)

    memory_name = "GPU memory" if torch.cuda.is_available() else "RSS"
    table, passed = summarize(results, opts.max_growth, memory_name)
    settings = (
        f"- settings: tiny model, {opts.steps} steps per method (warm-up {opts.warmup}), beta {opts.beta}, batch "
        f"{opts.batch}, generations {opts.num_generations}, completions up to {opts.completion_length} tokens, "
        f"learning rate {opts.learning_rate}, reward: fraction of digits, dynamic reward_threshold "
        f"{opts.reward_threshold}; pass: no non-finite value and growth < {opts.max_growth:.0%}"
    )
    notes = [f"- note: {scorer_note}"] if scorer_note else []
    report("soak.py", argv, [settings, *notes, *details(results, opts)], table, opts.output)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
