"""What the reference policy costs: step time and peak memory with β = 0 (no reference) and β > 0, ours and stock.

    python benchmarks/reference_cost.py --shape small-30m --steps 14 --warmup 2 --completion-length 16   # CPU
    python benchmarks/reference_cost.py --shape qwen2.5-0.5b --bf16 --steps 20                       # GPU
    python benchmarks/reference_cost.py --model smollm2 --steps 5 --warmup 1 --rounds 2 --completion-length 48

Variants, all on the same random model, data and seed, trained interleaved (see `step_overhead.py`):

- full model: stock `GRPOTrainer` at β = 0 (no reference: the baseline of this group), the same again (the A/A
  control: the noise of the measurement), stock at β > 0 (TRL loads a full copy of the model as the reference and
  scores every generation batch with it), ours at β > 0, and ours with `ref_reset_steps` (the copy is overwritten by
  the policy every few steps);
- LoRA: stock at β = 0 (the baseline of this group), stock at β > 0 (no copy: TRL scores the reference with the
  adapter disabled), ours at β > 0, and ours with `ref_reset_steps` (a frozen `"ref"` adapter, copied from the
  trained one at each reset).

The first table gives each variant's ratios to its group's β = 0 baseline: the cost of the reference. The second
gives ours / stock at the same β: the cost of this package on top of it.
"""

from __future__ import annotations

import sys
import time

import torch
from machine import report
from step_overhead import (
    benchmark_model,
    build_variant,
    checked_timing_options,
    interleaved_rounds,
    peak_memories,
    summarize,
    timing_arguments,
    timing_settings,
)

from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


FULL_BASE, LORA_BASE = "full, β = 0, stock", "LoRA, β = 0, stock"
FULL_STOCK, LORA_STOCK = "full, β > 0, stock (reference copy)", "LoRA, β > 0, stock (adapter disabled)"
FULL_OURS, LORA_OURS = "full, β > 0, ours", "LoRA, β > 0, ours"


def variants(reset_steps: int) -> dict[str, dict]:
    """Label → `{"lora", "beta", "fields"}` (`fields`: our config's fields; `None` for stock TRL)."""
    return {
        FULL_BASE: dict(lora=False, beta=0.0, fields=None),
        "full, β = 0, stock, again": dict(lora=False, beta=0.0, fields=None),
        FULL_STOCK: dict(lora=False, beta=None, fields=None),
        FULL_OURS: dict(lora=False, beta=None, fields={}),
        f"full, β > 0, ours, ref_reset_steps={reset_steps}": dict(
            lora=False, beta=None, fields={"ref_reset_steps": reset_steps}
        ),
        LORA_BASE: dict(lora=True, beta=0.0, fields=None),
        LORA_STOCK: dict(lora=True, beta=None, fields=None),
        LORA_OURS: dict(lora=True, beta=None, fields={}),
        f"LoRA, β > 0, ours, ref_reset_steps={reset_steps} ('ref' adapter)": dict(
            lora=True, beta=None, fields={"ref_reset_steps": reset_steps}
        ),
    }


def parse_args(argv):
    parser = timing_arguments(__doc__.split("\n")[0], lora=False)
    parser.add_argument("--reset-steps", type=int, default=4, help="ref_reset_steps of the reset variants")
    return checked_timing_options(parser, argv)


def main(argv=None):
    opts = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(opts.threads)
    scorer_note = install_cpu_scorer_if_needed()
    table = variants(opts.reset_steps)
    labels = list(table)
    model_dir = benchmark_model(opts)

    def build(label, steps):
        return build_variant(table[label], model_dir, opts, steps, lora=table[label]["lora"])

    times = interleaved_rounds(build, labels, opts)
    memory = peak_memories(build, labels, opts)

    group_base = {label: LORA_BASE if table[label]["lora"] else FULL_BASE for label in labels}
    ours = [label for label in labels if table[label]["fields"] is not None]
    same_beta = {label: LORA_STOCK if table[label]["lora"] else FULL_STOCK for label in ours}
    against_stock = [*dict.fromkeys([*same_beta.values(), *ours])]  # each stock row first, then ours
    lines = [
        "The cost of the reference: ratios to the group's β = 0 stock run.",
        "",
        *summarize(times, memory, group_base),
        "",
        "The cost of this package: ours / stock at the same β.",
        "",
        *summarize(
            {label: times[label] for label in against_stock},
            memory,
            {**same_beta, FULL_STOCK: FULL_STOCK, LORA_STOCK: LORA_STOCK},
        ),
    ]
    notes = [f"- note: {scorer_note}"] if scorer_note else []
    wall = f"- wall time: {(time.perf_counter() - started) / 60:.1f} min (the whole command)"
    report("reference_cost.py", argv, [timing_settings(opts), wall, *notes], lines, opts.output)
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
