"""What a KL at β = 0 costs: step time before and after `dynamic` switches β to 0, against stock TRL, and the memory
a full-model reference gives back once it is freed.

    python benchmarks/zero_beta_cost.py --model smollm2 --lora --steps 22 --switch-step 12 --warmup 1 --rounds 1 \\
        --completion-length 48 --output benchmarks/results/cpu-zero-beta-smollm2-lora.md
    python benchmarks/zero_beta_cost.py --shape tiny --lora --steps 12 --switch-step 6 --warmup 1 --rounds 1   # smoke

Time: five trainers on the same model, data and seed, trained interleaved (see `step_overhead.py`): ours with
`kl_adaptation_method="dynamic"`, `beta_min=0`, `beta_schedule_steps=--switch-step` (β = `--beta` before that step,
exactly 0 from it on; the reward threshold is never reached, so β does not decay before) with the reference forward
skipped (`kl_monitor_steps=0`: every skippable batch is skipped) and the same run with the skip disabled; stock
`GRPOTrainer` at β = `--beta` (the pre-switch comparison) and at β = 0 (the floor after the switch: TRL scores no
reference), twice (the A/A control). Steps before the switch are compared with stock at β > 0 over the same step
indices, steps from the switch on with stock at β = 0.

Memory (full fine-tuning, one trainer alone): the process's current memory at the end of the last step before the
switch (the reference copy alive) and at the end of the run (freed at the switch), against stock at β = 0.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from machine import current_memory_mib, precise_cpu_memory, report
from step_overhead import (
    benchmark_model,
    build_variant,
    checked_timing_options,
    interleaved_rounds,
    timing_arguments,
    timing_settings,
)
from transformers import TrainerCallback

from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


SKIP, NO_SKIP = "ours, dynamic → β = 0, reference skipped", "ours, dynamic → β = 0, skip disabled"
STOCK_BETA, STOCK_ZERO, STOCK_ZERO_AGAIN = "stock, β > 0", "stock, β = 0", "stock, β = 0, again"


def variants(switch_step: int) -> dict[str, dict]:
    """Label → `{"beta": β or None (--beta), "fields": our config's fields, None for stock TRL}`."""
    dynamic = dict(
        kl_adaptation_method="dynamic",
        beta_min=0.0,
        beta_schedule_steps=switch_step,
        reward_threshold=1e9,  # never reached: β stays --beta up to the switch
        kl_monitor_steps=0,
    )
    return {
        SKIP: dict(beta=None, fields=dynamic),
        NO_SKIP: dict(beta=None, fields={**dynamic, "skip_zero_beta_reference": False}),
        STOCK_BETA: dict(beta=None, fields=None),
        STOCK_ZERO: dict(beta=0.0, fields=None),
        STOCK_ZERO_AGAIN: dict(beta=0.0, fields=None),
    }


def phase_ratio(times: dict[str, list[dict]], label: str, base: str, steps: range, warmup: int) -> tuple:
    """Median step time of `label` over the optimizer steps `steps` (1-based), its ratio to `base`'s median over the
    same steps, and the interquartile range of the step-by-step paired ratios."""
    indices = [step - 1 - warmup for step in steps if step > warmup]

    def pick(name):
        return [run["times"][i] for run in times[name] for i in indices if i < len(run["times"])]

    ours, theirs = pick(label), pick(base)
    paired = [a / b for a, b in zip(ours, theirs)]
    low, _, high = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
    return statistics.median(ours), statistics.median(ours) / statistics.median(theirs), low, high, len(ours)


class MemoryAtSteps(TrainerCallback):
    """The process's current memory (MiB) at the end of each optimizer step."""

    def __init__(self):
        self.by_step: dict[int, float] = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.by_step[state.global_step] = current_memory_mib()


def memory_run(build, label: str, steps: int) -> dict[int, float]:
    trainer = build(label, steps)
    recorder = MemoryAtSteps()
    trainer.add_callback(recorder)
    trainer.train()
    del trainer
    return recorder.by_step


def parse_args(argv):
    parser = timing_arguments(__doc__.split("\n")[0], lora=True)
    parser.add_argument("--switch-step", type=int, default=12, help="beta_schedule_steps: β = 0 from this step on")
    parser.add_argument("--no-memory", action="store_true", help="skip the full-model memory runs")
    opts = checked_timing_options(parser, argv)
    if not opts.warmup + 2 <= opts.switch_step <= opts.steps - 1:
        parser.error("--switch-step must leave at least one timed step before the switch and one from it on")
    return opts


def main(argv=None):
    opts = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(opts.threads)
    scorer_note = install_cpu_scorer_if_needed()
    table = variants(opts.switch_step)
    model_dir = benchmark_model(opts)

    def build(label, steps, lora=opts.lora):
        return build_variant(table[label], model_dir, opts, steps, lora=lora)

    times = interleaved_rounds(build, list(table), opts)
    before, after = range(1, opts.switch_step), range(opts.switch_step, opts.steps + 1)
    rows = [
        (f"before the switch (steps {opts.warmup + 1}–{opts.switch_step - 1})", SKIP, STOCK_BETA, before),
        (f"before the switch (steps {opts.warmup + 1}–{opts.switch_step - 1})", NO_SKIP, STOCK_BETA, before),
        (f"from the switch (steps {opts.switch_step}–{opts.steps})", SKIP, STOCK_ZERO, after),
        (f"from the switch (steps {opts.switch_step}–{opts.steps})", NO_SKIP, STOCK_ZERO, after),
        (f"from the switch (steps {opts.switch_step}–{opts.steps})", STOCK_BETA, STOCK_ZERO, after),
        ("every step (A/A: the noise)", STOCK_ZERO_AGAIN, STOCK_ZERO, range(1, opts.steps + 1)),
    ]
    lines = [
        f"Step time (`{'LoRA' if opts.lora else 'full fine-tuning'}`): medians over the steps named, ratio of "
        "medians to the comparison run over the same steps, and the interquartile range of the step-by-step ratios.",
        "",
        "| steps | variant | median step (s) | against | ratio of medians | paired ratios, IQR | steps timed |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase, label, base, steps in rows:
        median, ratio, low, high, count = phase_ratio(times, label, base, steps, opts.warmup)
        ratios = f"**{ratio:.3f}** | {low:.3f}–{high:.3f}"
        lines.append(f"| {phase} | {label} | {median:.3f} | {base} | {ratios} | {count} |")

    if not opts.no_memory:
        if not torch.cuda.is_available():
            precise_cpu_memory()
        last_before = opts.switch_step - 1
        ours = memory_run(lambda label, steps: build(label, steps, lora=False), SKIP, opts.switch_step + 1)
        stock = memory_run(lambda label, steps: build(label, steps, lora=False), STOCK_ZERO, opts.switch_step + 1)
        lines += [
            "",
            "Memory (full fine-tuning, each run alone): the process's current memory at the end of a step, MiB.",
            "",
            f"| variant | step {last_before} (before the switch) | step {opts.switch_step + 1} (after it) | change |",
            "|---|---|---|---|",
        ]
        for label, memory in ((SKIP, ours), (STOCK_ZERO, stock)):
            start, end = memory[last_before], memory[opts.switch_step + 1]
            lines.append(f"| {label} | {start:.0f} | {end:.0f} | {end - start:+.0f} |")

    notes = [f"- note: {scorer_note}"] if scorer_note else []
    wall = f"- wall time: {(time.perf_counter() - started) / 60:.1f} min (the whole command)"
    memory = f"{opts.switch_step + 1} steps of full fine-tuning per variant, alone"
    settings = f"{timing_settings(opts, memory)}; switch to β = 0 at step {opts.switch_step}"
    report("zero_beta_cost.py", argv, [settings, wall, *notes], lines, opts.output)
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
