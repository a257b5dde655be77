"""Runs the five KL methods — none, clip, sigmoid, length_normalized, dynamic — with the same seed and budget, and
writes a summary table, per-step CSV and plots: `adaptive-kl demo`, as a script.

    python demos/run_all_methods.py                       # embedded policy and task, CPU, about 5 minutes
    python demos/run_all_methods.py --quick --out /tmp/demo
    python demos/run_all_methods.py --model Qwen/Qwen2.5-0.5B-Instruct --task gsm8k   # a real model on a GPU

Every option of `adaptive-kl demo` works here (`--help` lists them). The steps it takes, in `adaptive_kl.demo`:
`method_variants(DEMO_METHODS)` → `run_comparison(variants, DemoSettings(...))` → `write_report(runs, out)`.
"""

import sys

from adaptive_kl.console import main


if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
