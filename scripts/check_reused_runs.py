"""Checks that the runs a real-model study reuses from another study are what the current code gives: each reused run's
own command (`scripts/run_real_studies.py`'s) is started afresh with a checkpoint after its first two optimizer
steps, stopped there, and every metric both logged at steps 1 and 2 is compared with the committed run's, with ==.

    python scripts/check_reused_runs.py --study frontier_sum --seeds 0,1,2 --jobs 2 > reuse-check.md

Prints a markdown table, one row per run; exits 1 when a run differs (do not reuse it: rerun it in the study).
Each check costs the run's step-0 evaluation and two steps (~3 min for SmolLM2 at 64 tokens on one core).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = (1, 2)


def load_runner():
    spec = importlib.util.spec_from_file_location("run_real_studies", os.path.join(HERE, "run_real_studies.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def first_steps(run, runner, work: str) -> dict[int, dict]:
    """The logged metrics of `run`'s first two steps with the current code, from a fresh run of its own command stopped
    at its step-2 checkpoint (whose trainer_state.json holds the log)."""
    out = run.directory(work)  # the run's own command, into `work`
    argv = [*run.command(work, runner.STUDIES), "--save-every", str(STEPS[-1])]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # as the runner runs it, one thread a run
    os.makedirs(out)
    with open(os.path.join(out, "run.log"), "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=runner.REPOSITORY)
    pattern = os.path.join(out, "runs", "*", f"checkpoint-{STEPS[-1]}", "trainer_state.json")
    try:
        while not glob.glob(pattern):
            if process.poll() is not None:
                raise RuntimeError(f"{' '.join(argv)} ended (exit {process.returncode}) before step {STEPS[-1]}")
            time.sleep(3)
        time.sleep(5)  # the checkpoint's files are written one after another
        with open(glob.glob(pattern)[0]) as f:
            history = json.load(f)["log_history"]
    finally:
        process.kill()
        process.wait()
    return {entry["step"]: entry for entry in history if "step" in entry}


def compare(run, runner, work: str) -> tuple[int, list[str]]:
    """`(values compared, differences)` between the committed run's first two steps and the current code's."""
    with open(os.path.join(runner.REPOSITORY, run.directory(runner.STUDIES_DIR), "runs.json")) as f:
        (committed,) = json.load(f)
    old = {entry["step"]: entry for entry in committed["history"]}
    new = first_steps(run, runner, work)
    compared, differences = 0, []
    for step in STEPS:
        for key in sorted(set(old[step]) & set(new[step]) - {"step_time"}):  # step_time: the machine's, not the run's
            compared += 1
            if old[step][key] != new[step][key]:
                differences.append(f"step {step} {key}: {old[step][key]!r} committed, {new[step][key]!r} now")
    return compared, differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", required=True, help="the study whose reused runs to check")
    parser.add_argument("--seeds", default="0,1,2", help="the seeds to check (default 0,1,2)")
    parser.add_argument("--jobs", type=int, default=2, help="checks side by side, one thread each")
    args = parser.parse_args(argv)
    runner = load_runner()
    seeds = [int(s) for s in args.seeds.split(",")]
    reused = runner.STUDIES[args.study].get("reused", {})
    runs = [
        runner.source_run(runner.Run(args.study, variant, seed), runner.STUDIES)
        for variant in reused
        for seed in seeds
    ]
    runs = [run for run in runs if runner.finished(run, runner.STUDIES_DIR)]
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda run: compare(run, runner, work), runs))
    print("| reused run | values compared (steps 1-2) | result |\n|---|---|---|")
    for run, (compared, differences) in zip(runs, results):
        result = "bit for bit" if not differences else "differs: " + "; ".join(differences[:3])
        print(f"| `{run.directory(runner.STUDIES_DIR)}` | {compared} | {result} |")
    return 1 if any(differences for _, differences in results) else 0


if __name__ == "__main__":
    sys.exit(main())
