"""Runs the five KL methods — none, clip, sigmoid, length_normalized, dynamic — with the same seed and budget, and
writes a summary table, per-step CSV and plots. The same code as `adaptive-kl demo`, written out as a script.

    python demos/run_all_methods.py                       # embedded policy and task, CPU, < 10 minutes
    python demos/run_all_methods.py --steps 20 --out /tmp/demo
    python demos/run_all_methods.py --model Qwen/Qwen2.5-0.5B-Instruct --task gsm8k   # a real model on a GPU
"""

from __future__ import annotations

import argparse

from adaptive_kl.demo import DEMO_METHODS, DemoSettings, method_variants, run_comparison, summary_table, write_report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="hub id or local path (default: the embedded policy)")
    parser.add_argument("--task", default="embedded", choices=["embedded", "gsm8k"])
    parser.add_argument("--steps", type=int, default=DemoSettings.steps)
    parser.add_argument("--out", default="adaptive-kl-demo")
    opts = parser.parse_args(argv)

    settings = DemoSettings(out=opts.out, model=opts.model, task=opts.task, steps=opts.steps)
    settings.eval_every = max(1, settings.steps // 10)
    runs = run_comparison(method_variants(DEMO_METHODS), settings)
    paths = write_report(runs, settings.out, "The five KL methods")
    print(summary_table(runs))
    print("plots:", ", ".join(paths["plots"]))


if __name__ == "__main__":
    main()
