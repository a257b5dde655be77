"""Step time and peak memory of AdaptiveKLGRPOTrainer vs stock GRPOTrainer (same model, data, seed and β).

    python benchmarks/step_overhead.py                                # tiny model, CPU
    python benchmarks/step_overhead.py --shape qwen2.5-0.5b --lora --bf16 --steps 10   # GPU

Runs alternate (stock, then each method, repeated `--rounds` times) in one process. Step time is the median over
optimizer steps after `--warmup`; peak memory is `torch.cuda.max_memory_allocated` on a GPU and the process's peak
RSS on a CPU (RSS only grows, so on a CPU only the first runs' peaks are informative). Prints a markdown table of
ratios ours/stock.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import tempfile
import time

import torch
import transformers
import trl
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.tiny_model import save_random_model


METHODS = ("none", "clip", "sigmoid", "length_normalized", "dynamic")


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)


def brevity_reward(completions, **kwargs):
    return [1.0 / (1.0 + len(c)) for c in completions]


def peak_memory_mib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def run(variant: str, model_dir: str, opts) -> tuple[list[float], float]:
    common = dict(
        output_dir=tempfile.mkdtemp(),
        beta=0.04,
        max_steps=opts.steps,
        per_device_train_batch_size=opts.batch,
        num_generations=opts.batch,
        max_completion_length=opts.completion_length,
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
    if variant == "stock":
        cls, args = GRPOTrainer, GRPOConfig(**common)
    else:
        cls = AdaptiveKLGRPOTrainer
        args = AdaptiveKLGRPOConfig(**common, kl_adaptation_method=variant, kl_scaling=opts.kl_scaling)
    timer = StepTimer()
    trainer = cls(
        model=model_dir,
        reward_funcs=[brevity_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(32) for b in range(8)]}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear") if opts.lora else None,
        callbacks=[timer],
    )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    memory = peak_memory_mib()
    del trainer
    return timer.times[opts.warmup :], memory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="tiny", choices=["tiny", "qwen2.5-0.5b"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--kl-scaling", default="none")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    opts = parser.parse_args(argv)

    model_dir = save_random_model(tempfile.mkdtemp(), opts.shape, torch.bfloat16 if opts.bf16 else torch.float32)
    times = {v: [] for v in ("stock", *METHODS)}
    memory = {v: [] for v in times}
    for _ in range(opts.rounds):
        for variant in times:
            step_times, peak = run(variant, model_dir, opts)
            times[variant] += step_times
            memory[variant].append(peak)

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "CPU"
    print(f"\n{opts.shape}, lora={opts.lora}, bf16={opts.bf16}, batch={opts.batch}, completion={opts.completion_length}, "
          f"steps={opts.steps} (warmup {opts.warmup}) x {opts.rounds} rounds, kl_scaling={opts.kl_scaling}")
    print(f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}\n")
    stock_time, stock_mem = statistics.median(times["stock"]), max(memory["stock"])
    print("| variant | median step (s) | IQR (s) | time ratio | peak memory (MiB) | memory ratio |")
    print("|---|---|---|---|---|---|")
    for variant in times:
        t = times[variant]
        q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
        med, mem = statistics.median(t), max(memory[variant])
        print(f"| {variant} | {med:.4f} | {q[2] - q[0]:.4f} | {med / stock_time:.3f} | {mem:.0f} | {mem / stock_mem:.4f} |")


if __name__ == "__main__":
    main()
