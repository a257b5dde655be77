"""A sweep: `adaptive-kl compare` once per variant and seed, each run its own process and directory, surviving kills
and sessions. What `adaptive-kl frontier` runs, and what the real-model studies' runner (`scripts/run_real_studies.py`)
runs for each study.

    runs = [SweepRun("beta=0.02", seed) for seed in (0, 1, 2)]
    todo = [(f"seed {run.seed}", run.command(args, out, save_every=25), run.directory(out)) for run in runs]
    codes = run_sweep(todo, jobs=2)

A run writes `<root>/runs/<variant>/seed-<s>/` (`SweepRun.directory`): its `runs.json` (the run in full, with the
command that made it and its setup), `summary.md`, `metrics.csv`, `completions.md` and `run.log`. A run whose
`runs.json` exists is finished and never redone; one killed mid-way goes on from its latest checkpoint (`--save-every N
--resume`: a resumed run reports what the uninterrupted one does), so a kill loses at most N steps of each run in
flight. Either is reused only when it was trained with the setup of the command that would reuse it
(`setup_conflicts`: every option but how it is executed; a directory's name says only the variant and the seed). A
run in flight is claimed by its sweep's process (`running.pid` in its directory), so that a second sweep started later
over the same directory (more cores free, say) takes the next run instead of repeating one; a claim left by a process
that no longer lives is taken over.
"""

from __future__ import annotations

import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..usage import UsageError
from .arguments import command_setup, setup_differences
from .resume import checkpoint_setup
from .run_files import has_runs, load_runs
from .runner import variant_output_dir


CLAIM_FILE = "running.pid"


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: a variant as `compare --variant` takes it (`"beta=0.02 loss_type=grpo"`) and a seed."""

    variant: str
    seed: int

    def directory(self, root: str) -> str:
        """`<root>/runs/<variant as a file name>/seed-<seed>`."""
        slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.variant.replace(" ", "__"))
        return os.path.join(root, "runs", slug, f"seed-{self.seed}")

    def command(self, args: list[str], root: str, save_every: int | None = None) -> list[str]:
        """The `compare` command line of the run: the sweep's shared `args`, the variant, the seed, the directory; as a
        sweep executes it with `save_every`, a checkpoint every `save_every` steps and `--resume`. Checkpointing is
        how a run is executed, not what it computes (saving and resuming change no logged value)."""
        command = [
            sys.executable, "-m", "adaptive_kl", "compare", *args, "--variant", self.variant, "--seed", str(self.seed),
            "--out", self.directory(root), "--no-progress",
        ]  # fmt: skip
        if save_every is not None:
            command += ["--save-every", str(save_every), "--resume"]
        return command


FINISHED = "finished run"


def recorded_setup(directory: str, variant: str) -> tuple[str, dict | None] | None:
    """What a sweep's run directory holds that a rerun would reuse, and the setup it was trained with: `("finished
    run", setup)` from its runs.json (for a run that recorded none, the setup of the command it recorded; None
    without one), or `(checkpoint path, setup)` for a run killed after a checkpoint; None when it holds neither.
    `variant` is the run's variant as `compare` names it (its checkpoints' directory)."""
    if has_runs(directory):
        (run,) = load_runs(directory)
        recorded = run.provenance
        if "setup" not in recorded and "command" in recorded:
            try:
                return FINISHED, command_setup(shlex.split(recorded["command"])[1:])
            except ValueError:  # a command of several runs, or one this version no longer reads
                return FINISHED, None
        return FINISHED, recorded.get("setup")
    return checkpoint_setup(variant_output_dir(directory, variant))


def setup_conflicts(runs: list[tuple[str, str, list[str]]], unrecorded_ok: bool = False) -> list[tuple[str, str]]:
    """`(directory, why)` of each of the sweep's `runs` (`(label, directory, its compare command from "compare" on)`)
    whose directory holds a finished run or a checkpoint that was not trained with the setup of that command, so that
    reusing it would mix two setups: one that recorded another setup (why: the options that differ), one that
    recorded none (a checkpoint always; a finished run unless `unrecorded_ok`: runs made before runs recorded their
    command), or a checkpoint that `compare` did not save. A run in flight in another live sweep is that sweep's
    (`claim`): not read, and never moved."""
    conflicts = []
    for label, directory, argv in runs:
        if _claimed_by_live_process(os.path.join(directory, CLAIM_FILE)):
            continue
        expected = command_setup(argv)
        try:
            found = recorded_setup(directory, expected["variant"])
        except ValueError as error:
            conflicts.append((directory, f"{label}: {error}"))
            continue
        if found is None:
            continue
        where, setup = found
        if setup is None:
            if not (unrecorded_ok and where == FINISHED):
                conflicts.append((directory, f"{label} ({where}): made before runs recorded their setup"))
            continue
        differences = setup_differences(expected, setup)
        if differences:
            conflicts.append((directory, f"{label} ({where}): {'; '.join(differences)}"))
    return conflicts


REPLACED = "replaced"


def reuse_only_own_setups(runs: list[tuple[str, str, list[str]]], root: str, restart: bool, **options) -> None:
    """Before a sweep trains: where a run of `runs` (`setup_conflicts`) holds another setup, `UsageError` saying which
    and how to go on, unless `restart` (`--restart-changed`): then their directories move to
    `<root>/replaced/<date-time>/`, under the same path as below `root`, so that the sweep trains them again and
    nothing is deleted."""
    conflicts = setup_conflicts(runs, **options)
    if not conflicts:
        return
    if not restart:
        lines = "\n".join(f"  - {why}" for _, why in conflicts)
        raise UsageError(
            f"{len(conflicts)} run{'s' if len(conflicts) > 1 else ''} in {root} would be reused or resumed, but "
            f"{'were' if len(conflicts) > 1 else 'was'} trained with another setup than this command's: give the "
            "options they were trained with, use another --out, or add --restart-changed to train them again with "
            f"this command (their directories are moved to {os.path.join(root, REPLACED)}, not deleted). What "
            f"differs ('here' is this command, 'there' the run):\n{lines}"
        )
    folder = os.path.join(root, REPLACED, time.strftime("%Y%m%d-%H%M%S"))
    for directory, _ in conflicts:
        os.renames(directory, os.path.join(folder, os.path.relpath(directory, root)))
    print(f"{len(conflicts)} runs of another setup moved to {folder}, to be trained again", flush=True)


def claim(directory: str) -> bool:
    """Claims the run of `directory` for this process; False when it is finished or a live process has it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CLAIM_FILE)
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _claimed_by_live_process(path):
                return False
            os.remove(path)  # left by a sweep that was killed: take the run over
            continue
        with os.fdopen(descriptor, "w") as f:
            f.write(str(os.getpid()))
        if has_runs(directory):  # finished by another sweep between the listing and now
            release(directory)
            return False
        return True
    return False


def release(directory: str) -> None:
    path = os.path.join(directory, CLAIM_FILE)
    if os.path.isfile(path):
        os.remove(path)


def _claimed_by_live_process(path: str) -> bool:
    try:
        with open(path) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False  # an unreadable claim is a stale one
    if pid == os.getpid():
        return True  # another thread of this sweep
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def execute(
    argv: list[str],
    directory: str,
    threads: int,
    cwd: str | None = None,
    label: str = "",
    device: str | None = None,
    watch: Callable[..., None] | None = None,
) -> int:
    """Runs `argv` with `threads` torch threads (and only the GPU `device` visible, where given), its output appended
    to `directory/run.log` (a resumed run's log goes on after the killed one's); prints when it starts and ends.
    `watch(label, line, seconds since the start)` sees each line of the output as it comes, then `line=None` and the
    exit status at the end (`watch(label, None, seconds, code)`). Returns its exit status."""
    os.makedirs(directory, exist_ok=True)
    # Runs side by side must not fight over cores; unbuffered, so that each line is seen when it is written
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    start = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {label}" + (f" on GPU {device}" if device is not None else ""), flush=True)
    with open(os.path.join(directory, "run.log"), "a") as log:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True, errors="replace"
        )
        for line in process.stdout:
            log.write(line)
            log.flush()
            if watch is not None:
                watch(label, line, time.perf_counter() - start)
        code = process.wait()
    seconds = time.perf_counter() - start
    if watch is not None:
        watch(label, None, seconds, code)
    print(f"[{time.strftime('%H:%M:%S')}] {label}: exit {code} after {seconds / 60:.1f} min", flush=True)
    return code


def run_sweep(
    todo: list[tuple[str, list[str], str]],
    *,
    jobs: int = 1,
    threads: int | None = None,
    cwd: str | None = None,
    after_each: Callable[[str], None] | None = None,
    stop_file: str | None = None,
    progress: bool = True,
    devices: list[str] | None = None,
    watch: Callable[..., None] | None = None,
) -> list[int]:
    """Executes each `(label, argv, directory)` of `todo` not finished yet, `jobs` side by side with `threads` torch
    threads each (default: the cores shared by the jobs), skipping a run another live sweep has claimed; calls
    `after_each(label)` after every run that exits 0, one at a time; starts no further run once `stop_file` exists.
    Given `devices` (one per job: GPU names as `CUDA_VISIBLE_DEVICES` takes them), each run holds one of them while it
    runs, the only GPU it sees. `watch` sees every run's output (`execute`). A progress bar counts the runs
    (`progress`). Returns the exit statuses (0 for a run skipped)."""
    from tqdm.auto import tqdm

    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    lock = threading.Lock()  # one `after_each` at a time: two runs may finish together
    free = queue.Queue()  # the devices no run holds
    for device in devices or []:
        free.put(device)
    bar = tqdm(total=len(todo), unit="run", disable=None if progress else True, dynamic_ncols=True)

    def work(item: tuple[str, list[str], str]) -> int:
        label, argv, directory = item
        try:
            if stop_file and os.path.exists(stop_file):
                print(f"{label}: not started ({stop_file} exists)", flush=True)
                return 0
            if not claim(directory):
                print(f"{label}: done or in flight elsewhere, skipped", flush=True)
                return 0
            device = free.get() if devices else None  # a job's device is free when it starts: never waits
            try:
                code = execute(argv, directory, threads, cwd, label, device, watch)
            finally:
                release(directory)
                if device is not None:
                    free.put(device)
            if code == 0 and after_each is not None:
                with lock:
                    after_each(label)
            return code
        finally:
            bar.update(1)

    try:
        with ThreadPoolExecutor(jobs) as pool:
            return list(pool.map(work, todo))
    finally:
        bar.close()


UNRECORDED = "not recorded (made before provenance was recorded)"


def provenance_lines(provenances: list[dict]) -> list[str]:
    """The summary's note of where its runs' code came from, from each run's `runs.json` provenance (empty for runs
    made before it was recorded): the commits with how many runs each, then a warning when the recorded runs were
    made at different commits, or from source that differed from its commit (`source_modified`), either of which
    can be part of a difference between arms."""
    counts: dict[str, int] = {}
    for provenance in provenances:
        if not provenance:
            label = UNRECORDED
        elif provenance.get("commit") is None:
            label = "no git commit (not run from a checkout)"
        else:
            label = f"`{provenance['commit'][:10]}`"
        counts[label] = counts.get(label, 0) + 1
    lines = [
        "- commits of the runs (their runs.json provenance): "
        + "; ".join(f"{label} ({n} run{'s' if n > 1 else ''})" for label, n in counts.items())
    ]
    commits = list(dict.fromkeys(p["commit"][:10] for p in provenances if p and p.get("commit")))
    if len(commits) > 1:
        lines.append(
            f"- warning: the runs were made at {len(commits)} different commits ({', '.join(commits)}): a change "
            "between them may be part of a difference between arms"
        )
    modified = sum(1 for p in provenances if p and p.get("source_modified"))
    if modified:
        lines.append(
            f"- warning: {modified} run{'s were' if modified > 1 else ' was'} made from source that differed from "
            "its commit (source_modified): the code that ran is not exactly any commit"
        )
    return lines


def run_devices(directories: list[str]) -> str:
    """The `- device:` lines of the runs' own `summary.md` files, each with how many runs it ran (first seen first),
    e.g. `CPU: AMD EPYC, 2 cores, torch threads 1 (4 runs)`."""
    counts: dict[str, int] = {}
    for directory in directories:
        try:
            with open(os.path.join(directory, "summary.md")) as f:
                device = next((line[len("- device:") :].strip() for line in f if line.startswith("- device:")), None)
        except OSError:
            device = None
        device = device or "not recorded"
        counts[device] = counts.get(device, 0) + 1
    return "; ".join(f"{device} ({n} run{'s' if n > 1 else ''})" for device, n in counts.items())
