"""One file per finished run: `runs.json` beside a comparison's report, so that runs made apart (in other processes,
other sessions) can be summarized together, and a study can skip the runs it already has.

`adaptive-kl compare`/`demo` write `<out>/runs.json`: every `VariantRun` of the comparison as JSON (steps' logs,
validation evaluations, retention, KL-band warnings, wall time). `load_runs` reads it back into `VariantRun`s that
`report.write_report` summarizes exactly as it summarizes runs it has just trained (NaN and ±inf logged values are
kept: JSON's `NaN`/`Infinity` literals).
"""

from __future__ import annotations

import dataclasses
import json
import os

from .runner import VariantRun


RUNS_FILE = "runs.json"


def save_runs(runs: list[VariantRun], directory: str) -> str:
    """Writes `directory/runs.json` (through a temporary file, so a killed process never leaves half a file)."""
    path = os.path.join(directory, RUNS_FILE)
    scratch = path + ".tmp"
    with open(scratch, "w") as f:
        json.dump([dataclasses.asdict(run) for run in runs], f)
    os.replace(scratch, path)
    return path


def load_runs(directory: str) -> list[VariantRun]:
    """The runs `save_runs` wrote to `directory`."""
    with open(os.path.join(directory, RUNS_FILE)) as f:
        return [VariantRun(**fields) for fields in json.load(f)]


def has_runs(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, RUNS_FILE))
