"""A description of where a result was measured: date, device, versions and the command (benchmarks, studies)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
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


def versions() -> dict[str, str]:
    """The versions a result depends on: Python, torch and the Hugging Face libraries (Unsloth only when the process
    imported it: importing it here would patch TRL after the fact)."""
    import accelerate
    import datasets
    import peft
    import transformers
    import trl

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for module in (transformers, trl, peft, accelerate, datasets):
        found[module.__name__] = module.__version__
    if "unsloth" in sys.modules:
        found["unsloth"] = sys.modules["unsloth"].__version__
    return found


def source_commit() -> dict[str, object]:
    """The git commit of the `adaptive_kl` package that is running, and whether its source differs from that commit:
    `{"commit": sha, "source_modified": bool}`; `{"commit": None, ...}` when the package is not in a git checkout (a
    wheel). Read from the package's own directory, not the working directory: the code that ran is what a result
    depends on."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top and os.path.realpath(top) == os.path.realpath(root) else None
    if commit is None:  # not a checkout, or a wheel installed inside some other repository's tree
        return {"commit": None, "source_modified": None}
    changes = git("status", "--porcelain", "--untracked-files=no", "--", os.path.basename(package))
    return {"commit": commit, "source_modified": bool(changes)}


def environment_lines(command: str) -> list[str]:
    """Markdown lines naming the date, machine, versions and the command that produced a result."""
    found = versions()
    names = {"python": "Python", "torch": "torch", "transformers": "transformers", "trl": "trl", "unsloth": "unsloth"}
    versions_line = ", ".join(f"{label} {found[key]}" for key, label in names.items() if key in found)
    return [
        f"- date: {datetime.date.today().isoformat()}",
        f"- device: {device_name()}",
        f"- versions: {versions_line}",
        f"- command: `{command}`",
    ]
