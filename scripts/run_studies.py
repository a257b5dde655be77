"""Runs the seed studies of `docs/studies/` with `adaptive-kl compare`: one command reproduces all of them.

    python scripts/run_studies.py                     # every study not yet done, two at a time (2 cores)
    python scripts/run_studies.py --only beta length  # some of them
    python scripts/run_studies.py --force             # rerun those already done
    nohup python scripts/run_studies.py > studies.log 2>&1 &    # in the background (about 90 min on 2 cores)

Each study writes `docs/studies/<name>/` (`summary.md` with the command, machine, versions and wall time;
`metrics.csv` with every run; PNG plots) and its log to `docs/studies/<name>/run.log` (not committed). A study whose
`summary.md` exists is skipped, so an interrupted run picks up where it stopped (at the granularity of a study).
Every study runs at the demo's defaults (the embedded policy and task, 200 steps, β = 0.1, learning rate 1e-4) over
seeds 0–4 unless it says otherwise; `--seeds` changes the seeds and `--out` the parent directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
from adaptive_kl.demo.sweep import execute  # noqa: E402


STUDIES_DIR = os.path.join("docs", "studies")  # relative to the repository, so summaries record a portable command

# Name → the `adaptive-kl compare` arguments of the study (seeds, output and progress are added).
STUDIES = {  # longest first, so that two side by side finish close together
    # Length exploitation: a reward that saturates (the format alone), room to lengthen (64 tokens against the
    # policy's ~16), a large β, and the aggregations with opposite length incentives, in the loss (per-sequence mean
    # `grpo`, token sum `dr_grpo`, `length_normalized`, `clip`) and in the reward (k1 summed, k1 per token).
    "length": [
        "--variant", "loss_type=grpo",
        "--variant", "loss_type=dr_grpo",
        "--variant", "loss_type=grpo kl_adaptation_method=length_normalized",
        "--variant", "loss_type=grpo kl_adaptation_method=clip",
        "--variant", "loss_type=grpo kl_placement=reward kl_estimator=k1",
        "--variant", "loss_type=grpo kl_placement=reward kl_estimator=k1 kl_adaptation_method=length_normalized",
        "--set", "reward_weights=[1.0, 0.0]",
        "--set", "beta=0.3",
        "--set", "max_completion_length=64",
        "--steps", "250",
    ],
    # The tutorial's β ablation; β = 0 first, so the paired differences are the KL's effect.
    "beta": ["--beta", "0,0.001,0.01,0.1"],
    # The demo's five methods.
    "methods": ["--kl_adaptation_method", "none,clip,sigmoid,length_normalized,dynamic"],
    # The seed study of step-based β scaling.
    "scaling": ["--kl_scaling", "none,linear,sqrt,log"],
    # KL direction and placement: no KL, the textbook k1 in the reward, GRPO's k3 in the loss, k2's reverse-KL
    # gradient in the loss.
    "placement": [
        "--variant", "beta=0",
        "--variant", "kl_placement=reward kl_estimator=k1",
        "--variant", "kl_placement=loss kl_estimator=k3",
        "--variant", "kl_placement=loss kl_estimator=k2",
    ],
}  # fmt: skip
SHARED = ["--eval-every", "50"]


def command(name: str, seeds: str, out: str) -> list[str]:
    return [
        sys.executable, "-m", "adaptive_kl", "compare", *STUDIES[name], *SHARED, "--seed", seeds,
        "--out", os.path.join(out, name), "--no-progress",
    ]  # fmt: skip


def run(name: str, seeds: str, out: str, threads: int) -> int:
    """Runs study `name` (the sweep's `execute`: its log appended to `<out>/<name>/run.log`); its exit status."""
    argv = command(name, seeds, out)
    return execute(argv, os.path.join(REPOSITORY, out, name), threads, cwd=REPOSITORY, label=name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(STUDIES), help="studies to run (default: all)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of every study (default 0,1,2,3,4)")
    parser.add_argument("--jobs", type=int, default=2, help="studies run side by side (default 2)")
    parser.add_argument("--force", action="store_true", help="rerun studies whose summary.md exists")
    parser.add_argument("--out", default=STUDIES_DIR, help="parent directory of the studies (default docs/studies)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    names = [
        name
        for name in (args.only or STUDIES)
        if args.force or not os.path.exists(os.path.join(REPOSITORY, args.out, name, "summary.md"))
    ]
    if not names:
        print("Every study is done (its summary.md exists); --force reruns them.")
        return 0
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        codes = list(pool.map(lambda name: run(name, args.seeds, args.out, threads), names))
    failed = [name for name, code in zip(names, codes, strict=True) if code]
    if failed:
        print(f"Failed: {', '.join(failed)} (see docs/studies/<name>/run.log)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
