"""`adaptive-kl frontier`: which β gives which drift on your model and task, and does a method beat a constant β there?

    adaptive-kl frontier --model smollm2 --steps 100 --betas 0,0.02,0.05,0.1,0.2 --seeds 0,1,2 \\
        --variant 'beta=0.2 kl_adaptation_method=clip' --out my-frontier --jobs 2
    adaptive-kl frontier --model smollm2 --quick          # a smoke run: 2 steps, β = 0 and 0.2, 2 seeds
    adaptive-kl frontier --model smollm2 --quick --summarize   # the same sweep's summary, rewritten from its runs

Runs `adaptive-kl compare` once per β of the line and per `--variant`, on each seed (`sweep`), into
`<out>/runs/<variant>/seed-<s>/`, and writes `<out>/summary.md` (with `frontier.png`) after every run: constant β's
table of drift (the held-out KL to the start) and reward with what each β kept the drift under, each method's D (its
reward minus the line's at its drift, on its own seed) with its interval and Holm's adjustment, the secondaries at
matched drift, and what each method did (`demo.frontier`). Every option of `compare` that says what to train
(`--model`, `--task`, `--steps`, `--set`, ...) goes to each run unchanged. A finished run is never redone, a killed
one goes on from its latest checkpoint, and each run's `runs.json` records the command that made it and its setup:
run the same command again to resume, or with more `--seeds` or `--variant`s to extend. A finished run or a
checkpoint of another setup (the same directory, other options) is never reused: the command stops before training,
naming what differs, unless `--restart-changed` (`sweep.setup_conflicts`). Where GPUs are visible, each job runs on
one of its own (`job_devices`); the first steps of a run from step 0 give an estimate of the sweep's time
(`SweepClock`).

Importing this module imports no TRL, so that `--unsloth` can import Unsloth first.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import threading
from dataclasses import dataclass, field

from ..usage import UsageError, import_unsloth, quiet_host_libraries
from .arguments import TRAINERS, run_options


DEFAULT_BETAS = "0,0.02,0.05,0.1,0.2"
DEFAULT_SEEDS = "0,1,2"
QUICK_BETAS, QUICK_SEEDS = "0,0.2", "0,1"
# The studies' checkpoint interval: a kill loses at most this many steps of each run in flight.
DEFAULT_SAVE_EVERY = 25
# The start's point on every seed's line: the mean reward of the first steps (at most a quarter of the run).
START_STEPS = 5
# The secondaries at matched drift: accuracy on the built-in tasks, the held-out reward on a user's `--dataset`.
SECONDARY = ("final_accuracy", "length_drift", "delta_retention")
DATASET_SECONDARY = ("final_val_reward", "length_drift", "delta_retention")


def add_frontier_parser(commands: argparse._SubParsersAction) -> None:
    frontier = commands.add_parser(
        "frontier",
        parents=[run_options()],
        allow_abbrev=False,
        help="constant β's frontier of reward against drift on your model, and methods read against it",
        description=__doc__.split("\n")[0],
    )
    frontier.add_argument(
        "--betas",
        help=f"the constant-β line, comma-separated (default {DEFAULT_BETAS}; --quick: {QUICK_BETAS}); include 0 "
        "for the most drift",
    )
    frontier.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'FIELD=VALUE ...'",
        help="a method to read against the line, written out as compare takes it (repeat for each), e.g. "
        "--variant 'beta=0.2 kl_adaptation_method=clip'",
    )
    frontier.add_argument("--seeds", help=f"comma-separated seeds (default {DEFAULT_SEEDS}; --quick: {QUICK_SEEDS})")
    frontier.add_argument("--trainer", choices=TRAINERS, help="the trainer of every run (default grpo)")
    frontier.add_argument("--out", default="adaptive-kl-frontier", help="the sweep's directory (created if missing)")
    frontier.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs side by side (default 1); where GPUs are visible, each run gets one of its own, so at most as "
        "many as GPUs unless --share-gpus",
    )
    frontier.add_argument(
        "--share-gpus",
        action="store_true",
        help="let --jobs exceed the visible GPUs, dealt out to the jobs in turn (runs on one GPU share its memory)",
    )
    frontier.add_argument(
        "--threads", type=int, help="torch threads of each run (default: the machine's cores shared by --jobs)"
    )
    frontier.add_argument(
        "--save-every",
        type=int,
        default=DEFAULT_SAVE_EVERY,
        metavar="N",
        help=f"checkpoint every N steps, so that a killed run loses at most N (default {DEFAULT_SAVE_EVERY})",
    )
    frontier.add_argument("--no-progress", action="store_true", help="no progress bar")
    frontier.add_argument("--summarize", action="store_true", help="only rewrite the summary from the finished runs")
    frontier.add_argument(
        "--restart-changed",
        action="store_true",
        help="train again the runs in --out that were trained with another setup (their directories are moved to "
        "<out>/replaced/, not deleted); without it the command stops before training, naming the options that differ",
    )
    frontier.add_argument(
        "--stop-file", metavar="PATH", help="start no further run once PATH exists (the runs in flight finish)"
    )


def run_arguments(opts: argparse.Namespace) -> list[str]:
    """The `compare` options every run gets: those of `run_options` the command line gave, and `--trainer`."""
    args = []
    for name in ("model", "task", "steps", "eval_every", "n_validation", "lora_r", "lora_alpha"):
        value = getattr(opts, name)
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    if opts.gsm8k_path != "openai/gsm8k":
        args += ["--gsm8k-path", opts.gsm8k_path]
    for name in ("dataset", "dataset_train_split", "dataset_test_split"):
        value = getattr(opts, name)
        if value is not None:
            args += [f"--{name.replace('_', '-')}", value]
    for name in ("reward_funcs", "lora_target_modules"):  # lists
        if getattr(opts, name):
            args += [f"--{name.replace('_', '-')}", *getattr(opts, name)]
    args += ["--unsloth"] * opts.unsloth + ["--lora"] * opts.lora + ["--quick"] * opts.quick
    for assignment in opts.set:
        args += ["--set", assignment]
    if opts.trainer is not None:
        args += ["--trainer", opts.trainer]
    return args


def visible_gpus() -> list[str]:
    """The GPUs this process sees, named as `CUDA_VISIBLE_DEVICES` takes them: its own entries where it is set (the
    first `torch.cuda.device_count()` of them), else the indices."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def job_devices(jobs: int, share: bool) -> list[str] | None:
    """One device per job (`sweep.run_sweep`'s `devices`): the visible GPUs, each to one job; None without a GPU (the
    jobs share the cores). More jobs than GPUs is refused unless `share`: then the GPUs are dealt out in turn."""
    gpus = visible_gpus()
    if not gpus:
        return None
    if jobs > len(gpus) and not share:
        raise UsageError(
            f"--jobs {jobs} would stack runs on {len(gpus)} visible GPU{'s' if len(gpus) > 1 else ''} (each run "
            f"holds its model, optimizer and generation in one GPU's memory): use --jobs {len(gpus)}, or add "
            "--share-gpus to stack them on purpose"
        )
    return [gpus[job % len(gpus)] for job in range(jobs)]


# The sweep's time is estimated once a run that started at step 0 has logged this many steps, and again when the first
# such run succeeds.
ESTIMATE_AFTER_STEPS = 3
STEP_LINE = re.compile(r"^step (\d+)/(\d+)$")


@dataclass
class SweepClock:
    """Estimates a sweep's time from clean measurements of its runs' output (`sweep.execute`'s `watch`): only a run
    that starts at step 0 (its first `step k/N` line, `runner.VariantProgressCallback`, is step 1) is timed, never
    one resumed from a checkpoint, whose first steps are not its first. After such a run's first
    `ESTIMATE_AFTER_STEPS` steps, a run's time is the time to its first step, then a step's time over the remaining
    steps; when the first such run succeeds (exit 0), its whole time. A run that fails gives no estimate. Each times
    the runs still to do in turns of `jobs`. Prints each estimate once (and, at `start`, that none can be made yet);
    `estimates` keeps them (seconds)."""

    runs: int
    jobs: int
    eval_every: int
    steps: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # per run: its first (step, seconds)
    estimates: list[float] = field(default_factory=list)
    ended: bool = False  # the estimate from a whole run is made
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        if self.runs:
            print(
                f"No estimate of the sweep's time yet: it comes once a run that starts at step 0 has logged "
                f"{ESTIMATE_AFTER_STEPS} steps.",
                flush=True,
            )

    def watch(self, label: str, line: str | None, seconds: float, code: int | None = None) -> None:
        with self.lock:
            steps = self.steps.setdefault(label, [])
            from_start = bool(steps) and steps[0][0] == 1  # a run resumed from a checkpoint logs a later step first
            if line is None:  # the run ended
                if code == 0 and from_start and not self.ended:
                    self.ended = True
                    self._estimate(seconds, f"a whole run from step 0 took {_duration(seconds)}")
                return
            match = STEP_LINE.match(line.strip())
            if match is None or len(steps) >= ESTIMATE_AFTER_STEPS:
                return
            step, max_steps = int(match[1]), int(match[2])
            steps.append((step, seconds))
            if self.estimates or steps[0][0] != 1 or len(steps) < min(ESTIMATE_AFTER_STEPS, max_steps):
                return
            (first, at_first), (last, at_last) = steps[0], steps[-1]
            per_step = (at_last - at_first) / (last - first) if last > first else at_last / last
            run = at_first + (max_steps - first) * per_step
            self._estimate(
                run,
                f"from a run's first {len(steps)} steps: {_duration(at_first)} to its step {first} (loading, the "
                f"step-0 evaluation), then {per_step:.1f} s a step; evaluations every {self.eval_every} steps come "
                "on top",
            )

    def _estimate(self, run: float, basis: str) -> None:
        turns = -(-self.runs // self.jobs)
        self.estimates.append(run * turns)
        sweep = _duration(run * turns)
        print(
            f"Estimate: ~{_duration(run)} a run, {self.runs} runs {self.jobs} at a time: ~{sweep} for the sweep "
            f"({basis}).",
            flush=True,
        )


def _duration(seconds: float) -> str:
    """As a reader says it: seconds below 2 minutes, minutes below 2 hours, else hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _numbers(text: str, option: str, kind: type) -> list:
    values = [value.strip() for value in text.split(",") if value.strip()]
    try:
        parsed = [kind(value) for value in values]
    except ValueError:
        parsed = []
    if not parsed:
        raise UsageError(f"{option} expects comma-separated {kind.__name__}s, got {text!r}")
    if len(set(parsed)) != len(parsed):
        raise UsageError(f"{option} repeats a value: {text!r}")
    return parsed


def plan(opts: argparse.Namespace):
    """`(line, methods, seeds)`: the line's variants (`beta=<β>`, in the order given), the methods, and the seeds; bad
    values raise `UsageError`."""
    betas = opts.betas or (QUICK_BETAS if opts.quick else DEFAULT_BETAS)
    if any(beta < 0 for beta in _numbers(betas, "--betas", float)):
        raise UsageError(f"--betas must be >= 0, got {betas!r}")
    seeds = _numbers(opts.seeds or (QUICK_SEEDS if opts.quick else DEFAULT_SEEDS), "--seeds", int)
    line = [f"beta={beta.strip()}" for beta in betas.split(",") if beta.strip()]  # as written: the runs' names
    if any(assignment.split("=", 1)[0].strip().replace("-", "_") == "beta" for assignment in opts.set):
        raise UsageError("--set beta=... would fix every run's β: the line's are --betas, a method's its --variant")
    methods = [" ".join(variant.split()) for variant in opts.variant]
    if len(set(methods)) != len(methods):
        raise UsageError("--variant repeats a method")
    for method in methods:
        if not any(part.startswith("beta=") for part in method.split()):
            raise UsageError(
                f"--variant {method!r} sets no beta: a method starts from its own β (e.g. 'beta=0.2 {method}')"
            )
        if method in line:
            raise UsageError(f"--variant {method!r} is a point of the line (--betas)")
    return line, methods, seeds


def frontier_of(line: list[str], settings):
    """The frontier the summary reads: the line as `compare` names its variants, the held-out KL to the start against
    the reward of the last quarter, the start's point on every line, and the secondaries at matched drift (those of
    `settings.task`)."""
    from .frontier import Frontier

    return Frontier(
        line=tuple(", ".join(variant.split()) for variant in line),
        secondary=DATASET_SECONDARY if settings.task == "dataset" else SECONDARY,
        start_steps=max(1, min(START_STEPS, settings.steps // 4)),
    )


def main(argv: list[str]) -> int:
    """Runs `adaptive-kl frontier ...` (`argv` from the subcommand's name on): bad input is `adaptive-kl: error: ...`,
    exit status 2, before any run starts."""
    from .arguments import build

    parser = argparse.ArgumentParser(prog="adaptive-kl", allow_abbrev=False)
    add_frontier_parser(parser.add_subparsers(dest="command", required=True))
    opts = parser.parse_args(argv)
    try:
        if opts.unsloth:  # the runs' commands are checked here, which builds their configs: Unsloth first
            import_unsloth()
        from .sweep import SweepRun, reuse_only_own_setups

        for name in ("jobs", "save_every"):
            if getattr(opts, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(opts, name)}")
        if opts.threads is not None and opts.threads < 1:
            raise UsageError(f"--threads must be at least 1, got {opts.threads}")
        devices = None if opts.summarize else job_devices(opts.jobs, opts.share_gpus)
        quiet_host_libraries()
        line, methods, seeds = plan(opts)
        args = run_arguments(opts)
        runs = [SweepRun(variant, seed) for seed in seeds for variant in [*line, *methods]]
        # Every variant's command checked as its run will read it, before any run starts.
        settings = None
        for variant in [*line, *methods]:
            settings, *_ = build(SweepRun(variant, seeds[0]).command(args, opts.out)[3:])
        if opts.restart_changed and opts.summarize:
            raise UsageError("--restart-changed trains runs again; --summarize trains none: keep one")
        # A finished run or a checkpoint is reused only where this command would train the same (a directory's name
        # says only the variant and the seed): the last check, since --restart-changed moves runs aside
        labelled = [(f"{run.variant}, seed {run.seed}", run.directory(opts.out), run.command(args, opts.out)[3:])
                    for run in runs]  # fmt: skip
        reuse_only_own_setups(labelled, opts.out, opts.restart_changed)
    except UsageError as error:
        print(f"adaptive-kl: error: {error}", file=sys.stderr)
        return 2
    command = "adaptive-kl " + shlex.join(argv)
    frontier = frontier_of(line, settings)
    codes = []
    if not opts.summarize:
        from .run_files import has_runs
        from .sweep import run_sweep

        todo = [run for run in runs if not has_runs(run.directory(opts.out))]
        print(f"{len(runs)} runs, {len(runs) - len(todo)} finished; {len(todo)} to do in {opts.out}", flush=True)
        clock = SweepClock(len(todo), opts.jobs, settings.eval_every)
        clock.start()
        codes = run_sweep(
            [(f"{run.variant}, seed {run.seed}", run.command(args, opts.out, opts.save_every),
              run.directory(opts.out)) for run in todo],
            jobs=opts.jobs,
            threads=opts.threads,
            after_each=lambda _: write_summary(opts.out, runs, frontier, command),
            stop_file=opts.stop_file,
            progress=not opts.no_progress,
            devices=devices,
            watch=clock.watch,
        )  # fmt: skip
        if any(codes):
            failed = [f"{run.variant}, seed {run.seed}" for run, code in zip(todo, codes) if code]
            print(f"{len(failed)} runs failed (their run.log says why): {'; '.join(failed)}", file=sys.stderr)
    summary = write_summary(opts.out, runs, frontier, command)
    print(f"Wrote {summary}" if summary else "No finished run yet: no summary.")
    return 1 if any(codes) else 0


def write_summary(out: str, runs, frontier, command: str) -> str | None:
    """Rewrites `<out>/summary.md`, `metrics.csv` and the plots from the sweep's finished runs; returns the summary's
    path (None before any run has finished)."""
    from ..metrics.environment import environment_lines
    from .frontier import write_frontier_report
    from .run_files import has_runs, load_runs
    from .sweep import provenance_lines, run_devices

    done = [run for run in runs if has_runs(run.directory(out))]
    if not done:
        return None
    trained = []
    for run in done:
        (loaded,) = load_runs(run.directory(out))
        label = ", ".join(run.variant.split())  # as `compare --seed` names a seed's run, so the report groups them
        loaded.name, loaded.config = f"{label}, seed={run.seed}", {**loaded.config, "seed": run.seed}
        trained.append(loaded)
    order = list(dict.fromkeys(run.variant for run in runs))
    counts = {variant: sum(1 for run in done if run.variant == variant) for variant in order}
    notes = "\n".join(
        [
            "Each run: `adaptive-kl compare ... --variant <variant> --seed <s>` (its `runs.json` records the whole "
            "command).",
            "",
            "Seeds so far: " + "; ".join(f"{', '.join(v.split())}: {n}" for v, n in counts.items()) + ".",
            "",
            *(f"- devices of the runs: {run_devices([run.directory(out) for run in done])}" if line.startswith(
                "- device:") else line for line in environment_lines(command)),
            f"- wall time: {sum(run.wall_time for run in trained) / 3600:.2f} h of training and evaluation over "
            f"{len(trained)} runs",
            *provenance_lines([run.provenance for run in trained]),
        ]
    )  # fmt: skip
    title = "adaptive-kl frontier: constant β's reward against drift, and the methods"
    return write_frontier_report(trained, out, title, notes, frontier)["summary"]
