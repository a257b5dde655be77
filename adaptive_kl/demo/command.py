"""`adaptive-kl demo` and `adaptive-kl compare`: trains the variants the command line asks for, then writes the report
and prints its summary.

    adaptive-kl demo                                  # the five methods on the embedded task, CPU, < 10 min
    adaptive-kl demo --quick                          # a smoke run, < 90 s
    adaptive-kl compare --kl_scaling none,linear,sqrt,log
    adaptive-kl compare --kl_adaptation_method clip,sigmoid --set beta=0.1 --set kl_target=0.05
    adaptive-kl compare --beta 0,0.001,0.01,0.1                                    # the tutorial's β ablation
    adaptive-kl compare --kl_placement loss,reward --kl_estimator k1,k3 --set diversity_metrics=true
    adaptive-kl compare --trainer grpo,binomial_kl                                 # GRPO vs the binomial-KL (SPO) loss
    adaptive-kl demo --trainer rloo                                                # the five methods on RLOO
    adaptive-kl demo --model Qwen/Qwen2.5-0.5B-Instruct --unsloth --task gsm8k     # a real model on a GPU

Every `AdaptiveKLGRPOConfig` (with `--trainer rloo`, `AdaptiveKLRLOOConfig`; with `--trainer binomial_kl`,
`BinomialKLConfig`) field can be varied in `compare` as `--<field> v1,v2,...` (several give their product) or fixed
for all variants with `--set field=value` (`arguments` reads them). Results go to `--out`: summary.md, metrics.csv
and PNG plots (the plots need the `demo` extra: matplotlib); the terminal gets the summary's main columns
(`report.TERMINAL_COLUMNS`).

Importing this module imports no TRL, so that `--unsloth` can import Unsloth first.
"""

from __future__ import annotations

import os
import shlex
import sys
import time

from ..usage import UsageError, import_unsloth, quiet_host_libraries
from .arguments import build


def main(argv: list[str]) -> int:
    """Runs `adaptive-kl demo ...` or `adaptive-kl compare ...` (`argv` from the subcommand's name on): a bad input
    is `adaptive-kl: error: ...`, exit status 2, before anything is trained."""
    try:
        if "--unsloth" in argv:
            if "--model" not in argv and not any(a.startswith("--model=") for a in argv):
                raise UsageError(
                    "--unsloth loads a real model: give it with --model (e.g. Qwen/Qwen2.5-0.5B-Instruct)"
                )
            import_unsloth()
        quiet_host_libraries()
        settings, variants, title, progress = build(argv)
    except UsageError as error:
        print(f"adaptive-kl: error: {error}", file=sys.stderr)
        return 2
    from ..metrics.environment import environment_lines, source_commit
    from .report import TERMINAL_COLUMNS, summary_table, write_completions, write_report
    from .run_files import save_runs
    from .runner import run_comparison
    from .variants import TRAINER_CLASSES, TRAINER_LABELS

    command = "adaptive-kl " + shlex.join(argv)
    commit = source_commit()  # before training: the code this process imported
    start = time.perf_counter()
    runs = run_comparison(variants, settings, progress=progress)
    wall_time = time.perf_counter() - start
    seeds = ", ".join(map(str, sorted({run.config.get("seed", settings.seed) for run in runs})))
    trainers = ", ".join(
        f"{TRAINER_LABELS[name]} ({TRAINER_CLASSES[name][2]})"
        for name in dict.fromkeys(run.config["trainer"] for run in runs)
    )
    untrained = untrained_note(runs)
    notes = "\n".join(
        [
            f"Model: {settings.model or 'embedded reference policy'}; trainer: {trainers}; task: {settings.task}; "
            f"{settings.steps} steps per variant; seed(s) {seeds}; validation accuracy by greedy decoding on "
            f"{settings.n_validation} problems.",
            *(["", untrained] if untrained else []),
            "",
            *environment_lines(command),
            f"- wall time: {wall_time / 60:.1f} min for {len(runs)} runs{resumed_note(runs)}",
        ]
    )
    for run in runs:
        run.provenance = provenance(run, settings, command, commit)
    paths = write_report(runs, settings.out, title, notes)
    save_runs(runs, settings.out)
    write_completions(runs, os.path.join(settings.out, "completions.md"))
    print("\n" + summary_table(runs, TERMINAL_COLUMNS))
    if untrained:
        print(untrained)
    print(f"Wrote {paths['summary']}, {paths['csv']} and {len(paths['plots'])} plots to {settings.out}")
    if not paths["plots"]:
        print("No plots: matplotlib is not installed. pip install 'adaptive-kl[demo]' for them.")
    return 0


def provenance(run, settings, command: str, commit: dict) -> dict:
    """What `runs.json` records of where `run` ran, so that a study can check each run against its own command: its
    seed, the full command line, its setup (what a rerun must match to reuse it: `arguments.run_setup`), the package's
    git commit (and whether its source differed from it), the versions, the device and the date."""
    from ..metrics.environment import device_name, versions
    from .arguments import run_setup

    seed = run.config.get("seed", settings.seed)
    return {
        "seed": seed,
        "command": command,
        "setup": run_setup(settings.setup, run.name, seed),
        **commit,
        "versions": versions(),
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
    }


def resumed_note(runs) -> str:
    """What the wall-time line adds when runs were resumed from checkpoints: which, at which steps, and their time in
    all (before the resumes included); empty when none was."""
    resumed = [run for run in runs if run.resumed_at]
    if not resumed:
        return ""
    where = "; ".join(f"{run.name} at step {', '.join(map(str, run.resumed_at))}" for run in resumed)
    total = sum(run.wall_time for run in runs) / 60
    return f" in this process, resumed from checkpoints ({where}); {total:.1f} min in all, before the resumes included"


def untrained_note(runs) -> str | None:
    """What to say when some runs trained nothing: every optimizer step they logged had a gradient norm of 0 (every
    group's rewards tied, so the advantages were 0, and a fresh LoRA still equals its reference, so the KL's gradient
    was 0 too). None when every run had a gradient."""
    idle = [
        run.name
        for run in runs
        if not any(entry.get("grad_norm", 0.0) != 0.0 for entry in run.history if "grad_norm" in entry)
    ]
    if not idle:
        return None
    which = "no run trained" if len(idle) == len(runs) else f"{len(idle)} of {len(runs)} runs did not train"
    return (
        f"Note: {which} ({', '.join(idle)}): every step's gradient norm was 0. In so few steps every group's "
        "completions got the same reward (no advantage to learn from) and the policy still equals its reference "
        "(no KL gradient), so the weights did not change. Run more steps (e.g. --steps 20) to see training."
    )
