"""`benchmarks/gpu_check.sh --dry-run`: the GPU script's whole path on the CPU (Unsloth's generated trainer, LoRA,
parity, every method's training, the TRL process), so that the script a GPU session runs in one call is known to
work. Timings are reported, never asserted. Needs Unsloth (CI's TRL 1.15 environment); elsewhere it skips."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest


pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("unsloth") is None or importlib.util.find_spec("unsloth_zoo") is None,
    reason="unsloth is not installed (CI installs it in its TRL 1.15 environment: see .ci/run)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path):
    output = tmp_path / "gpu-check.md"
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), "--dry-run", "--output", str(output)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    report = output.read_text()
    assert "- device: CPU" in report and "DRY RUN" in report
    assert "parity: PASS" in report and "training: PASS" in report
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    expected = ["Unsloth stock", "Unsloth stock, again", "ours, none", "ours, clip", "ours, sigmoid"]
    expected += ["ours, length_normalized", "ours, dynamic", "ours, k2", "ours, k3+", "ours, ref_reset_steps=5"]
    assert set(expected + ["TRL stock", "ours, none, on TRL"]) <= set(rows)
    for label in expected:
        cells = [c.strip() for c in rows[label].strip("|").split("|")]
        assert cells[1] == "3" and cells[2] == "yes", rows[label]  # 3 steps, every logged value finite
