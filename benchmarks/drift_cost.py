"""What the drift controller's measurement costs: step time and peak memory with `kl_controller="drift"` against the
same run with β held (`kl_controller="fixed"`), ours both.

    python benchmarks/drift_cost.py --model smollm2 --lora --steps 11 --warmup 1 --rounds 2 --completion-length 48 \\
        --output benchmarks/results/cpu-drift-cost-smollm2-lora.md
    python benchmarks/drift_cost.py --lora --steps 6 --warmup 1 --rounds 1   # tiny model, smoke

Variants, on the same model, data and seed, trained interleaved (see `step_overhead.py`): ours with a constant β (the
baseline), the same again (the A/A control: the noise of the measurement), and the drift controller at its defaults
(`drift_every=5`, `drift_samples=32`) and measuring after every step (`drift_every=1`: the cost of one measurement,
on every step). The held-out texts are `--drift-samples` prompts of the training set's form, each with a completion
of `--completion-length` tokens (the ratio of held-out tokens to trained tokens sets the cost). The target is far
below any drift, so β is raised at every measurement up to its ceiling: the cost does not depend on β.
"""

from __future__ import annotations

import sys
import time

import torch
from datasets import Dataset
from machine import report
from step_overhead import (
    benchmark_model,
    build_trainer,
    checked_timing_options,
    interleaved_rounds,
    peak_memories,
    summarize,
    timing_arguments,
    timing_settings,
)
from transformers import AutoTokenizer

from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


FIXED, FIXED_AGAIN = "ours, β held (kl_controller='fixed')", "ours, β held, again"


def variants(drift_samples: int) -> dict[str, dict]:
    """Label → our config's fields."""
    drift = dict(kl_controller="drift", target_drift=1e-6, beta_max=1.0, drift_samples=drift_samples)
    return {
        FIXED: {},
        FIXED_AGAIN: {},
        f"drift, every 5 steps, {drift_samples} texts": drift,
        f"drift, every step, {drift_samples} texts": {**drift, "drift_every": 1},
    }


def held_out_texts(opts, tokenizer) -> Dataset:
    """`--drift-samples` rows: a prompt of the training set's form and a completion of `--completion-length` tokens."""
    words = " ".join(str(i % 10) for i in range(4 * opts.completion_length))
    completion_ids = tokenizer(words, add_special_tokens=False)["input_ids"][: opts.completion_length]
    completion = tokenizer.decode(completion_ids)
    prompts = [f"{i}+{i % 7}=" for i in range(opts.drift_samples)]
    return Dataset.from_dict({"prompt": prompts, "completion": [completion] * len(prompts)})


def parse_args(argv):
    parser = timing_arguments(__doc__.split("\n")[0])
    parser.add_argument("--drift-samples", type=int, default=32, help="held-out texts the drift is measured on")
    return checked_timing_options(parser, argv)


def main(argv=None):
    opts = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(opts.threads)
    scorer_note = install_cpu_scorer_if_needed()
    table = variants(opts.drift_samples)
    labels = list(table)
    model_dir = benchmark_model(opts)
    texts = held_out_texts(opts, AutoTokenizer.from_pretrained(model_dir))

    def build(label, steps):
        return build_trainer(table[label], model_dir, opts, steps, eval_dataset=texts)

    times = interleaved_rounds(build, labels, opts)
    memory = peak_memories(build, labels, opts)
    lines = ["Ratios to ours with β held.", "", *summarize(times, memory, dict.fromkeys(labels, FIXED))]
    notes = [f"- note: {scorer_note}"] if scorer_note else []
    wall = f"- wall time: {(time.perf_counter() - started) / 60:.1f} min (the whole command)"
    settings = f"{timing_settings(opts)}; held-out texts {opts.drift_samples} of {opts.completion_length} tokens"
    report("drift_cost.py", argv, [settings, wall, *notes], lines, opts.output)
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
