"""The training part alone, to the percent: one micro-batch's loss forward and backward with this package's trainer
(at its defaults, and on its adaptive path) against stock TRL's `GRPOTrainer`, as a ratio with its 95% interval, next
to an A/A interval.

    python benchmarks/loss_cost.py                                                    # tiny model, CPU
    python benchmarks/loss_cost.py --model smollm2 --lora --prompts 2 --completion-length 128 --reps 40
    python benchmarks/loss_cost.py --shape qwen2.5-0.5b --lora --bf16 --prompts 2 --completion-length 256   # GPU

Five trainers on the same weights: stock, stock again (the A/A: what the measurement reads where nothing differs),
ours at the same β with every field at its default, ours adapting β and ours with its own KL term (`VARIANTS`). One
micro-batch laid out as training lays it out (`testing.batches.grouped_inputs`: prompts repeated over their group,
completions of different lengths, drifted reference and old log-probabilities) goes through each trainer's
`compute_loss` and `backward`, the five in turn, the order rotating every repetition, after `--warmup` untimed
repetitions. Generation, rewards and the optimizer step are left out: they are the host's alone, so they only dilute
the ratio (`step_overhead.py` measures the whole step).

Time: `time.perf_counter` on a CPU, CUDA events on a GPU, with Python's garbage collector paused in a timed pass and
collected between repetitions. Each repetition gives the paired ratios ours/stock and stock again/stock; the ratio
reported is their geometric mean, with the 95% interval of Student's t over the repetitions (n − 1 degrees of freedom)
on the log-ratios. Memory, over `--memory-reps` further repetitions (untimed: its bookkeeping would disturb the
times): the peak of each pass above the memory before it (`torch.cuda.max_memory_allocated` on a GPU, the process's
peak resident set on a CPU: see `machine.py`), as the mean difference ours − stock (and A/A) in MiB with its 95%
interval.

Prints, and with `--output` writes, the two rows and the settings. `--count-ops` instead counts the tensor
operations of one pass per variant (a `TorchDispatchMode`), and which of them the package's own code issued: on a
model whose passes are mostly Python, each costs some microseconds whatever its size, so the count says where a cost
on the tiny model comes from. At the defaults, what ours runs beyond stock's must all be the package's.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable

import accelerate
import torch
from machine import current_memory_mib, peak_memory_mib, precise_cpu_memory, report, reset_peak_memory
from step_overhead import benchmark_model, build_trainer, timing_arguments
from torch.utils._python_dispatch import TorchDispatchMode

from adaptive_kl.demo.seeds import mean_interval
from adaptive_kl.testing.batches import grouped_inputs
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


STOCK, STOCK_AGAIN, OURS = "stock", "stock, again", "ours (defaults)"
ADAPTING, OWN_TERM = "ours (adapting β)", "ours (own term)"
# Ours at the defaults: the host keeps its own KL term, and the package measures the KL beside it. Adapting β: a
# schedule that changes nothing (α(t) = γ^(t−1) = 1 at γ = 1), the path of every adaptation that chooses β_t alone (a
# schedule, `dynamic`, a target-KL controller): the host keeps its own term, at β_t. Own term: the package's term
# replaces the host's, through a transform that changes nothing (k3 ≥ 0 clipped at 1e30), the path of every
# adaptation that changes the term (a transform, another estimator, length normalization, the zero-std mask): both
# rows time an adaptive path itself, on the same numbers as stock's.
VARIANTS = {
    STOCK: None,
    STOCK_AGAIN: None,
    OURS: {},
    ADAPTING: {"kl_scaling": "exp", "kl_scaling_rate": 1.0},
    OWN_TERM: {"kl_adaptation_method": "clip", "kl_clip_threshold": 1e30},
}


def elapsed_clock() -> Callable[[], Callable[[], float]]:
    """A clock for one pass: `start = clock()` starts it, `start()` returns the seconds since (CUDA events on a GPU,
    which time the device's work; `perf_counter` on a CPU)."""
    if torch.cuda.is_available():

        def start_events():
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()

            def stop() -> float:
                end.record()
                end.synchronize()
                return begin.elapsed_time(end) / 1000

            return stop

        return start_events

    def start_counter():
        begin = time.perf_counter()
        return lambda: time.perf_counter() - begin

    return start_counter


def forward_and_backward(trainer, inputs: dict) -> None:
    """The training part of one micro-batch: the trainer's loss, and its backward."""
    trainer.compute_loss(trainer.model, inputs).backward()


def forward_only(trainer, inputs: dict) -> None:
    """The loss of one micro-batch without its backward (`--forward-only`): with the whole pass's ratio, it tells
    whether a cost is in the forward or the backward."""
    trainer.compute_loss(trainer.model, inputs)


def timed_pass(trainer, inputs: dict, clock, run=forward_and_backward) -> float:
    """One `run(trainer, inputs)` (a loss forward and backward), timed: its seconds."""
    trainer.model.zero_grad(set_to_none=True)
    stop = clock()
    run(trainer, inputs)
    return stop()


def memory_pass(trainer, inputs: dict, run=forward_and_backward) -> float:
    """One `run(trainer, inputs)`, untimed: its peak memory above the memory before it, in MiB."""
    trainer.model.zero_grad(set_to_none=True)
    reset_peak_memory()
    baseline = current_memory_mib()
    run(trainer, inputs)
    return peak_memory_mib() - baseline


def rotations(labels: list[str], reps: int):
    """Each repetition's order of the variants: all of them, the first rotating by one every repetition."""
    for rep in range(reps):
        yield labels[rep % len(labels) :] + labels[: rep % len(labels)]


def and_log(run):
    """`run`, then the log line a trainer writes (`trainer.log`: TRL averages its metrics of the passes since the last
    line, the package turns its recorded sums into `adaptive_kl/*`)."""

    def run_and_log(trainer, inputs: dict) -> None:
        run(trainer, inputs)
        trainer.log({})

    return run_and_log


def measure(
    trainers: dict,
    inputs: dict,
    reps: int,
    warmup: int,
    run=forward_and_backward,
    memory_reps: int = 10,
    log_every: int | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Each variant's `{"time": [...], "memory": [...]}`: times over `reps` repetitions after `warmup` untimed ones,
    then peak memories over `memory_reps` more after a warm-up one; in each repetition the variants run once each, the
    order rotating. `run(trainer, inputs)`: the pass that is measured; with `log_every`, every `log_every`-th
    repetition's pass also writes the log line (`and_log`), so that what a trainer does once per line is in the times,
    amortized as in training.

    Time and memory are measured apart. A timed pass runs with Python's garbage collector paused (as `timeit` does),
    collected between repetitions, the objects built before the passes frozen out of its reach; nothing else.
    Reading a CPU's peak memory needs a full collection, glibc's trim and a reset of the peak before each pass and a
    fixed mmap threshold (`machine.precise_cpu_memory`), which would put page faults of memory handed back to the
    system and the collector's pauses into the times."""
    clock = elapsed_clock()
    labels = list(trainers)
    results = {label: {"time": [], "memory": []} for label in labels}
    gc.collect()
    gc.freeze()  # the models, trainers and inputs: later collections only walk what the passes made
    try:
        for rep, order in enumerate(rotations(labels, warmup + reps)):
            gc.disable()
            logs = log_every is not None and (rep + 1) % log_every == 0
            times = {
                label: timed_pass(trainers[label], inputs, clock, and_log(run) if logs else run) for label in order
            }
            gc.enable()
            gc.collect()
            if rep >= warmup:
                for label in labels:
                    results[label]["time"].append(times[label])
    finally:
        gc.enable()
        gc.unfreeze()
    if not torch.cuda.is_available():
        precise_cpu_memory()
    for rep, order in enumerate(rotations(labels, 1 + memory_reps)):
        for label in order:
            peak = memory_pass(trainers[label], inputs, run)
            if rep > 0:  # the first, in the allocator's new mode, is a warm-up
                results[label]["memory"].append(peak)
    return results


PACKAGE = os.path.dirname(sys.modules["adaptive_kl"].__file__) + os.sep
# The libraries both the host and the package call (a reduction through Accelerate is its caller's operation).
LIBRARIES = tuple(os.path.dirname(module.__file__) + os.sep for module in (torch, accelerate))
HOST = "the host, autograd and the harness"


class OperationCounter(TorchDispatchMode):
    """Counts the tensor operations run under it, each under the function that issued it: the innermost frame outside
    torch's and Accelerate's code, named `file:function` when it is the package's, else `HOST`."""

    def __init__(self):
        super().__init__()
        self.issued_by = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(LIBRARIES):
            frame = frame.f_back
        path = frame.f_code.co_filename if frame is not None else ""
        issuer = f"{path[len(PACKAGE) :]}:{frame.f_code.co_name}" if path.startswith(PACKAGE) else HOST
        self.issued_by[issuer] += 1
        return func(*args, **(kwargs or {}))


def count_operations(trainers: dict, inputs: dict, run=forward_and_backward) -> dict[str, tuple[Counter, Counter]]:
    """Per variant, the tensor operations of one pass (after an uncounted one) and of the log line after it
    (`trainer.log`, which turns the pass's recorded sums into metrics), each by the function that issued them."""
    counts = {}
    for label, trainer in trainers.items():
        trainer.model.zero_grad(set_to_none=True)
        and_log(run)(trainer, inputs)
        trainer.model.zero_grad(set_to_none=True)
        with OperationCounter() as counter:
            run(trainer, inputs)
        with OperationCounter() as log_counter:
            trainer.log({})
        counts[label] = counter.issued_by, log_counter.issued_by
    return counts


def operations_table(counts: dict[str, tuple[Counter, Counter]]) -> list[str]:
    """Per variant: the operations of a pass, those beyond stock's, and those the package issued, with the functions
    that issued the most; then those of a log line (once per `logging_steps` × micro-batches a step) beyond stock's."""
    stock, stock_log = (sum(issued.values()) for issued in counts[STOCK])
    lines = [
        "| variant | tensor operations of a pass | beyond stock's | issued by the package "
        "| by the package's functions | a log line's, beyond stock's |",
        "|---|---|---|---|---|---|",
    ]
    for label, (issued, logged) in counts.items():
        total, package = sum(issued.values()), sum(n for issuer, n in issued.items() if issuer != HOST)
        functions = ", ".join(f"`{issuer}` {n}" for issuer, n in issued.most_common() if issuer != HOST)
        log_line = sum(logged.values()) - stock_log
        lines.append(f"| {label} | {total} | {total - stock:+d} | {package} | {functions or '—'} | {log_line:+d} |")
    return lines


def ratio_interval(numerators: list[float], denominators: list[float]) -> tuple[float, float, float, int]:
    """`(ratio, low, high, n)`: the geometric mean of the paired ratios and its 95% t-interval (on the logs)."""
    mean, half, n = mean_interval([math.log(a / b) for a, b in zip(numerators, denominators, strict=True)])
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half), n


def difference_interval(values: list[float], baseline: list[float]) -> tuple[float, float, int]:
    """`(mean, half-width, n)` of the paired differences `values − baseline` (95%, t)."""
    return mean_interval([a - b for a, b in zip(values, baseline, strict=True)])


def summarize(results: dict) -> list[str]:
    """The table: per row (ours, and the A/A), the time ratio to stock with its interval and the interval's half-width
    in percent, the median pass time, and the peak memory's difference from stock."""
    stock = results[STOCK]
    lines = [
        "| against stock | n | time ratio | 95% interval | ± (%) | median pass (s) | peak above start (MiB) "
        "| memory difference (MiB), 95% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in (label for label in (OURS, ADAPTING, OWN_TERM, STOCK_AGAIN) if label in results):  # those measured
        ratio, low, high, n = ratio_interval(results[label]["time"], stock["time"])
        memory, memory_half, _ = difference_interval(results[label]["memory"], stock["memory"])
        lines.append(
            f"| {label} | {n} | **{ratio:.4f}** | {low:.4f}–{high:.4f} | {100 * (high - low) / 2:.2f} "
            f"| {statistics.median(results[label]['time']):.4f} | {statistics.fmean(results[label]['memory']):.1f} "
            f"| {memory:+.1f} ± {memory_half:.1f} |"
        )
    return lines


def parse_args(argv):
    parser = timing_arguments(__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts of the micro-batch (each with its group)")
    parser.add_argument("--reps", type=int, default=30, help="timed repetitions (each runs every variant once)")
    parser.add_argument("--memory-reps", type=int, default=10, help="repetitions that measure peak memory, untimed")
    parser.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="write the log line (trainer.log) after every this many repetitions' passes, in the times: TRL's "
        "logging_steps default with one micro-batch a step (1: a line after every pass, the most a run can log)",
    )
    parser.add_argument(
        "--count-ops", action="store_true", help="count each variant's tensor operations of one pass instead of timing"
    )
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="time the loss forward alone (no backward; the log line as set by --log-every): beside a run of the "
        "whole pass, where a cost lies",
    )
    parser.set_defaults(warmup=3)
    opts = parser.parse_args(argv)
    for option, value in (("--reps", opts.reps), ("--memory-reps", opts.memory_reps)):
        if value < 2:
            parser.error(f"{option} must be at least 2 for an interval, got {value}.")
    if opts.log_every < 1:
        parser.error(f"--log-every must be at least 1, got {opts.log_every}.")
    return opts


def main(argv=None):
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    scorer_note = install_cpu_scorer_if_needed()  # TRL 1.15 on a CPU: stock and ours alike
    model_dir = benchmark_model(opts)
    opts.batch = opts.prompts * opts.num_generations
    trainers = {label: build_trainer(fields, model_dir, opts, steps=1) for label, fields in VARIANTS.items()}
    for trainer in trainers.values():
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    inputs = grouped_inputs(trainers[STOCK], opts.prompts, opts.completion_length, micro_batches=1)
    model = f"model {opts.model}" if opts.model else f"shape {opts.shape}"
    settings = (
        f"- settings: {model}, lora {opts.lora}, bf16 {opts.bf16}, beta {opts.beta}, one micro-batch of "
        f"{opts.prompts} prompts x {opts.num_generations} completions of up to {opts.completion_length} tokens; "
    )
    notes = [f"- note: {scorer_note}"] if scorer_note else []
    if opts.count_ops:
        settings += "the tensor operations of one loss forward and backward, after one uncounted, and of a log line"
        counts = count_operations(trainers, inputs)
        report("loss_cost.py", argv, [settings, *notes], operations_table(counts), opts.output)
        return
    run = forward_only if opts.forward_only else forward_and_backward
    results = measure(
        trainers, inputs, opts.reps, opts.warmup, run, memory_reps=opts.memory_reps, log_every=opts.log_every
    )
    settings += (
        f"loss {'forward alone' if opts.forward_only else 'forward and backward'}, a log line after every "
        f"{opts.log_every} (in the times), "
        f"{opts.reps} repetitions after {opts.warmup}, variants in rotating order, "
        f"the garbage collector paused in a timed pass; peak memory over {opts.memory_reps} more repetitions; "
        f"{'CUDA events' if torch.cuda.is_available() else 'perf_counter'}, torch threads {opts.threads}"
    )
    report("loss_cost.py", argv, [settings, *notes], summarize(results), opts.output)


if __name__ == "__main__":
    main()
