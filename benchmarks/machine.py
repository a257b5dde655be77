"""What the benchmarks share: a description of the machine and versions, and per-run peak memory.

Peak memory is `torch.cuda.max_memory_allocated` on a GPU. On a CPU it is the process's peak resident set size
(VmHWM), which Linux lets a process reset (`/proc/self/clear_refs`), so runs alternating in one process each get
their own peak. For that peak to follow live tensors rather than the allocator's caching, `precise_cpu_memory()`
makes glibc serve every block of 64 KiB or more by its own mapping, returned to the system when freed, and freed
memory is trimmed before each run.
"""

from __future__ import annotations

import ctypes
import gc
import re
import sys
import warnings

import torch

from adaptive_kl.metrics.environment import device_name, environment_lines  # noqa: F401  (re-exported)


def report(script: str, argv: list[str] | None, details: list[str], table: list[str], output: str | None) -> None:
    """Prints a result (environment, `details` lines, markdown `table`) and writes it to `output` if given."""
    command = " ".join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])
    text = "\n".join([*environment_lines(command), *details, "", *table, ""])
    print(text)
    if output:
        with open(output, "w") as f:
            f.write(text)


def _rss_mib(field: str) -> float:
    """VmHWM (peak) or VmRSS (current) from /proc; `resource`'s lifetime peak where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) / 1024
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # bytes on macOS


def precise_cpu_memory() -> bool:
    """Fixes glibc's mmap threshold at 64 KiB (no dynamic growth); False where that is not possible (not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_mmap_threshold = -3  # mallopt parameter number, from malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 64 * 1024))


def reset_peak_memory() -> None:
    """Starts a new peak-memory window (after releasing what earlier runs freed)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:  # not Linux: only the process's lifetime peak exists, so later runs cannot go below earlier ones
        warnings.warn("cannot reset the peak RSS here: CPU peak memory is the process's lifetime peak", stacklevel=2)


def peak_memory_mib() -> float:
    """Peak memory since the last `reset_peak_memory()`, in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return _rss_mib("VmHWM")


def current_memory_mib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.memory_allocated() / 2**20
    return _rss_mib("VmRSS")
