"""`KLMonitor`: what the KL term measured, summed per optimizer step for the β controller and per log line for the
`adaptive_kl/*` metrics.

Each micro-batch through the trainer's loss is recorded, with its KL statistics (`kl.metrics.STAT_INDEX`, summed over
processes), or without, when it was scored without the reference (β_t = 0). The monitor only accumulates: at the last
micro-batch of an optimizer step the trainer takes the step's sums (`end_step`) for the controller and the KL-triggered
reference resets (`lifecycle.AdaptiveKLRun`), and at each log the metrics of the micro-batches since the previous log
are written to TRL's metric store, which averages and logs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..kl.metrics import kl_metrics


class BetaInUse(NamedTuple):
    """The β of the last micro-batch recorded."""

    beta: float  # β_t
    scale: float  # β_t / β_base: the schedule's factor


@dataclass
class MicroBatchCounts:
    """The micro-batches through the loss since the last log, in one mode."""

    skipped: int = 0  # scored without the reference (β_t = 0): their KL term is exactly 0
    scored: int = 0  # in all


def _modes(value) -> dict:
    return {"train": value(), "eval": value()}


@dataclass
class KLMonitor:
    """The KL statistics of one trainer's loss, between optimizer steps and between log lines.

    Args:
        step_stats (`torch.Tensor` or `None`): the summed statistics of the optimizer step in progress.
        log_stats (`dict[str, torch.Tensor | None]`): per mode, the summed statistics since the last log (of the
            micro-batches scored with the reference only).
        counts (`dict[str, MicroBatchCounts]`): per mode, the micro-batches recorded since the last log.
        last_beta (`dict[str, BetaInUse]`): per mode, the β of the last micro-batch recorded.
        zero_std_fractions (`list[float]`): the fraction of zero-std groups a saturation-triggered β read at each
            optimizer step since the last log.
    """

    step_stats: torch.Tensor | None = None
    log_stats: dict[str, torch.Tensor | None] = field(default_factory=lambda: _modes(lambda: None))
    counts: dict[str, MicroBatchCounts] = field(default_factory=lambda: _modes(MicroBatchCounts))
    last_beta: dict[str, BetaInUse] = field(default_factory=dict)
    zero_std_fractions: list[float] = field(default_factory=list)

    def start_run(self) -> None:
        """A new `train()` call: an exception (e.g. from a reward function) can interrupt an optimizer step after some
        of its micro-batches were recorded, and those partial sums must not leak into the next run."""
        self.step_stats = None
        self.log_stats = _modes(lambda: None)
        self.counts = _modes(MicroBatchCounts)
        self.zero_std_fractions = []

    def record(self, stats: torch.Tensor | None, mode: str, beta: float, scale: float) -> None:
        """Accumulates one micro-batch's statistics (None: scored without the reference) and the β it applied."""
        self.last_beta[mode] = BetaInUse(beta, scale)
        self.counts[mode].scored += 1
        if stats is None:
            self.counts[mode].skipped += 1
            return
        self.log_stats[mode] = stats if self.log_stats[mode] is None else self.log_stats[mode] + stats
        if mode == "train":
            self.step_stats = stats if self.step_stats is None else self.step_stats + stats

    def note_zero_std_fraction(self, fraction: float) -> None:
        """The fraction of zero-std groups a saturation-triggered β read at an optimizer step, for the next log."""
        self.zero_std_fractions.append(fraction)

    def end_step(self) -> torch.Tensor | None:
        """The summed statistics of the optimizer step that just ended (None: none of its micro-batches was scored
        with the reference), and a fresh sum for the next."""
        stats, self.step_stats = self.step_stats, None
        return stats

    def write_metrics(self, metrics: dict[str, list[float]], mode: str) -> bool:
        """Writes the `adaptive_kl/*` metrics of the micro-batches since the last log into TRL's `metrics` of `mode`
        (which it averages, and prefixes with `eval_` in evaluation), then starts the next log's sums. Returns whether
        it wrote any: False when no micro-batch went through the loss since the last log."""
        counts = self.counts[mode]
        if not counts.scored:
            return False
        beta, scale = self.last_beta[mode]
        stats = self.log_stats[mode]
        if stats is not None:  # the KL metrics: from the micro-batches scored with the reference only
            for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                metrics[key] = [value]
        else:
            metrics["adaptive_kl/current_beta"], metrics["adaptive_kl/beta_scale"] = [beta], [scale]
        metrics["adaptive_kl/reference_skipped"] = [counts.skipped / counts.scored]
        if mode == "train" and self.zero_std_fractions:  # what the saturation trigger read, averaged like TRL's
            finite = [value for value in self.zero_std_fractions if not math.isnan(value)]  # NaN: nothing measured
            metrics["adaptive_kl/zero_std_fraction"] = [sum(finite) / len(finite) if finite else float("nan")]
            self.zero_std_fractions = []
        self.log_stats[mode] = None
        self.counts[mode] = MicroBatchCounts()
        return True
