"""`KLMonitor`: what the KL term measured, summed per optimizer step for the β controller and per log line for the
`adaptive_kl/*` metrics.

Each micro-batch through the trainer's loss is recorded, with its per-sequence KL sums (`kl.metrics.kl_sequence_sums`,
this process's), or without, when it was scored without the reference (β_t = 0). The monitor only keeps them: they
become statistics (`kl.metrics.STAT_INDEX`), summed over processes in one reduction, when something reads them. At the
last micro-batch of an optimizer step the trainer takes the step's statistics (`end_step`) when the controller or the
KL-triggered reference resets read the KL (`lifecycle.AdaptiveKLRun`), and at each log the metrics of the
micro-batches since the previous log are written to TRL's metric store, which averages and logs them. A micro-batch
thus costs its per-sequence sums only, a handful of tensor operations beside the host's loss; the moments, totals and
the all-reduce come once per log line (every process logs at the same steps, so the reduction is collective).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..kl.metrics import kl_metrics, statistics_of_sequences


# Recorded micro-batches are folded into statistics at least this often, so that what the monitor holds stays bounded
# when nothing reads it for a long time (a run that never logs; a long evaluation).
FOLD_EVERY = 64


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
class RecordedSums:
    """The per-sequence sums of the micro-batches recorded since the last read, as statistics on demand."""

    folded: torch.Tensor | None = None  # the statistics of the micro-batches folded so far (this process's)
    pending: list[torch.Tensor] = field(default_factory=list)  # the `(5, B)` sums of those since

    def add(self, sums: torch.Tensor) -> None:
        self.pending.append(sums)
        if len(self.pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        stats = statistics_of_sequences(torch.cat(self.pending, dim=1))
        self.folded = stats if self.folded is None else self.folded + stats
        self.pending = []

    def statistics(self) -> torch.Tensor | None:
        """This process's statistics of every micro-batch recorded (None: none was)."""
        if self.pending:
            self._fold()
        return self.folded


@dataclass
class KLMonitor:
    """The KL statistics of one trainer's loss, between optimizer steps and between log lines.

    Args:
        step_sums (`RecordedSums`): the micro-batches of the optimizer step in progress scored with the reference.
        log_sums (`dict[str, RecordedSums]`): per mode, those since the last log.
        counts (`dict[str, MicroBatchCounts]`): per mode, the micro-batches recorded since the last log.
        last_beta (`dict[str, BetaInUse]`): per mode, the β of the last micro-batch recorded.
        zero_std_fractions (`list[float]`): the fraction of zero-std groups a saturation-triggered β read at each
            optimizer step since the last log.
    """

    step_sums: RecordedSums = field(default_factory=RecordedSums)
    log_sums: dict[str, RecordedSums] = field(default_factory=lambda: _modes(RecordedSums))
    counts: dict[str, MicroBatchCounts] = field(default_factory=lambda: _modes(MicroBatchCounts))
    last_beta: dict[str, BetaInUse] = field(default_factory=dict)
    zero_std_fractions: list[float] = field(default_factory=list)

    def start_run(self) -> None:
        """A new `train()` call: an exception (e.g. from a reward function) can interrupt an optimizer step after some
        of its micro-batches were recorded, and those partial sums must not leak into the next run."""
        self.step_sums = RecordedSums()
        self.log_sums = _modes(RecordedSums)
        self.counts = _modes(MicroBatchCounts)
        self.zero_std_fractions = []

    def record(self, sums: torch.Tensor | None, mode: str, beta: float, scale: float) -> None:
        """Keeps one micro-batch's `(5, B)` per-sequence sums (None: scored without the reference) and the β it
        applied."""
        self.last_beta[mode] = BetaInUse(beta, scale)
        self.counts[mode].scored += 1
        if sums is None:
            self.counts[mode].skipped += 1
            return
        self.log_sums[mode].add(sums)
        if mode == "train":
            self.step_sums.add(sums)

    def note_zero_std_fraction(self, fraction: float) -> None:
        """The fraction of zero-std groups a saturation-triggered β read at an optimizer step, for the next log."""
        self.zero_std_fractions.append(fraction)

    def end_step(self, sum_over_processes: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor | None:
        """The statistics of the optimizer step that just ended, summed by `sum_over_processes` (None: nothing reads
        them, and they are dropped), and a fresh record for the next. None when none of its micro-batches was scored
        with the reference."""
        recorded, self.step_sums = self.step_sums, RecordedSums()
        if sum_over_processes is None:
            return None
        stats = recorded.statistics()
        return sum_over_processes(stats) if stats is not None else None

    def write_metrics(
        self, metrics: dict[str, list[float]], mode: str, sum_over_processes: Callable[[torch.Tensor], torch.Tensor]
    ) -> bool:
        """Writes the `adaptive_kl/*` metrics of the micro-batches since the last log into TRL's `metrics` of `mode`
        (which it averages, and prefixes with `eval_` in evaluation), their statistics summed by `sum_over_processes`,
        then starts the next log's sums. Returns whether it wrote any: False when no micro-batch went through the loss
        since the last log."""
        counts = self.counts[mode]
        if not counts.scored:
            return False
        beta, scale = self.last_beta[mode]
        stats = self.log_sums[mode].statistics()
        if stats is not None:  # the KL metrics: from the micro-batches scored with the reference only
            stats = sum_over_processes(stats)
            for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                metrics[key] = [value]
        else:
            metrics["adaptive_kl/current_beta"], metrics["adaptive_kl/beta_scale"] = [beta], [scale]
        metrics["adaptive_kl/reference_skipped"] = [counts.skipped / counts.scored]
        if mode == "train" and self.zero_std_fractions:  # what the saturation trigger read, averaged like TRL's
            finite = [value for value in self.zero_std_fractions if not math.isnan(value)]  # NaN: nothing measured
            metrics["adaptive_kl/zero_std_fraction"] = [sum(finite) / len(finite) if finite else float("nan")]
            self.zero_std_fractions = []
        self.log_sums[mode] = RecordedSums()
        self.counts[mode] = MicroBatchCounts()
        return True
