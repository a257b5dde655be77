"""A description of where a result was measured: date, device, versions and the command (benchmarks, studies)."""

from __future__ import annotations

import datetime
import os
import platform
import sys

import torch


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    name = model or platform.processor() or platform.machine()
    return f"CPU: {name}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def environment_lines(command: str) -> list[str]:
    """Markdown lines naming the date, machine, versions and the command that produced a result."""
    import transformers
    import trl

    versions = f"Python {platform.python_version()}, torch {torch.__version__}"
    versions += f", transformers {transformers.__version__}, trl {trl.__version__}"
    if "unsloth" in sys.modules:  # only when the run used it: importing it here would patch TRL after the fact
        versions += f", unsloth {sys.modules['unsloth'].__version__}"
    return [
        f"- date: {datetime.date.today().isoformat()}",
        f"- device: {device_name()}",
        f"- versions: {versions}",
        f"- command: `{command}`",
    ]
