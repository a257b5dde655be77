"""`KLMonitor`: what the KL term measured, summed per optimizer step for the β controller and per log line for the
`adaptive_kl/*` metrics.

Each micro-batch through the trainer's loss is recorded, with its per-sequence KL sums (`kl.metrics.kl_sequence_sums`,
this process's), or without, when it was scored without the reference (β_t = 0). The monitor only keeps them: they
become statistics (`kl.metrics.STAT_INDEX`), summed over processes in one reduction, when something reads them. At the
last micro-batch of an optimizer step the trainer takes the step's statistics (`end_step`) when the controller or the
KL-triggered reference resets read the KL (`lifecycle.AdaptiveKLRun`), and at each log the metrics of the
micro-batches since the previous log are written to TRL's metric store, which averages and logs them. A micro-batch
thus costs its per-sequence sums only, a handful of tensor operations beside the host's loss; the moments, totals and
the all-reduce come once per log line (every process logs at the same steps, so the reduction is collective). Where
the KL is only measured (the host's loss holds its own term) and no step reads it, a micro-batch costs even less: it
is recorded as `PendingSums`, its detached log-probabilities, and the sums of all such micro-batches are computed when
read, those of equal shapes in one call.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..kl.metrics import host_kl_mean, kl_metrics, kl_sequence_sums, statistics_of_sequences
from ..kl.term import KLEstimates


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


class PendingSums(NamedTuple):
    """A micro-batch's `(5, B)` per-sequence sums, not yet computed: `measure(**tensors, **dict(settings))`.

    Micro-batches with the same `measure`, settings and tensor shapes are measured in one call, their tensors
    concatenated along the sequences, which `measure` must allow (row-wise: `kl.term.measured_sequence_sums`). On a
    small model each tensor operation of a micro-batch costs microseconds beside its loss; this way a log line pays
    them once per shape, not once per micro-batch."""

    measure: Callable[..., torch.Tensor]
    tensors: dict[str, torch.Tensor]  # `(B, ...)` each, detached
    settings: tuple[tuple[str, object], ...] = ()  # hashable

    @classmethod
    def of_estimates(cls, estimates: KLEstimates) -> PendingSums:
        """The sums of a micro-batch's per-token estimates (`kl.term.kl_term_and_estimates`), made later."""
        tensors = dict(raw_kl=estimates.raw_kl.detach(), adapted_kl=estimates.adapted_kl.detach(), mask=estimates.mask)
        if estimates.host_kl is not None:
            tensors["host_kl"] = estimates.host_kl.detach()
        settings = (("clip_threshold", estimates.clip_threshold), ("zero_outside_mask", True))  # `sequence_sums`'s
        return cls(kl_sequence_sums, tensors, settings)

    def sums(self) -> torch.Tensor:
        """The `(5, B)` sums, now."""
        return self.measure(**self.tensors, **dict(self.settings))

    @property
    def group(self) -> tuple:
        return self.measure, self.settings, *self.tensors, *(tensor.shape for tensor in self.tensors.values())


def measured(recorded: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-sequence sums of `recorded` micro-batches (`(5, B)` sums or `PendingSums`): `(5, N)`, concatenated
    along the sequences in some order (the statistics do not depend on it), and each micro-batch's totals, `(5, M)`
    in the order recorded."""
    groups = defaultdict(list)  # the micro-batches measured together, with their places in `recorded`
    for place, item in enumerate(recorded):
        groups[item.group if isinstance(item, PendingSums) else ("sums", place)].append((place, item))
    sums, totals, places = [], [], []
    for members in groups.values():
        first = members[0][1]
        if isinstance(first, PendingSums):
            tensors = {name: concatenated([item.tensors[name] for _, item in members], 0) for name in first.tensors}
            first = first._replace(tensors=tensors).sums()  # (5, M_g·B)
        sums.append(first)
        rows = first.size(1) // len(members)  # equal shapes: the same B each
        totals.append(first.view(first.size(0), len(members), rows).sum(-1))  # (5, M_g)
        places.extend(place for place, _ in members)
    totals = concatenated(totals, 1)
    if places != sorted(places):
        totals = totals[:, torch.tensor(places, device=totals.device).argsort()]
    return concatenated(sums, 1), totals


def concatenated(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """`torch.cat(tensors, dim)`, without the copy `cat` makes of a single tensor (a log line with one micro-batch, or
    one shape of them): each tensor operation it skips is some microseconds on a CPU."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim)


@dataclass
class RecordedSums:
    """The per-sequence sums of the micro-batches recorded since the last read, as statistics on demand."""

    folded: torch.Tensor | None = None  # the statistics of the micro-batches folded so far (this process's)
    folded_totals: list[torch.Tensor] = field(default_factory=list)  # their totals, `(5, M)` each, in order
    pending: list[torch.Tensor | PendingSums] = field(default_factory=list)  # those since: sums, or how to make them

    def add(self, sums: torch.Tensor | PendingSums) -> None:
        self.pending.append(sums)
        if len(self.pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        sums, totals = measured(self.pending)
        stats = statistics_of_sequences(sums)
        self.folded = stats if self.folded is None else self.folded + stats
        self.folded_totals.append(totals)
        self.pending = []

    def statistics(self) -> torch.Tensor | None:
        """This process's statistics of every micro-batch recorded (None: none was)."""
        if self.pending:
            self._fold()
        return self.folded

    def micro_batch_totals(self) -> torch.Tensor:
        """Each micro-batch's `(5,)` totals (`kl_sequence_sums` summed over its sequences), `(5, M)` in the order
        recorded; after `statistics`."""
        return concatenated(self.folded_totals, 1)


@dataclass
class KLMonitor:
    """The KL statistics of one trainer's loss, between optimizer steps and between log lines.

    Args:
        reads_steps (`bool`): whether anything reads an optimizer step's statistics (`end_step`); without, the steps
            keep no sums.
        step_sums (`RecordedSums`): the micro-batches of the optimizer step in progress scored with the reference.
        log_sums (`dict[str, RecordedSums]`): per mode, those since the last log.
        counts (`dict[str, MicroBatchCounts]`): per mode, the micro-batches recorded since the last log.
        last_beta (`dict[str, BetaInUse]`): per mode, the β of the last micro-batch recorded.
        zero_std_fractions (`list[float]`): the fraction of zero-std groups a saturation-triggered β read at each
            optimizer step since the last log.
        policy_loss_terms (`dict[str, list[tuple[int, torch.Tensor]]]`): per mode, the KL terms TRL's `policy_loss`
            entries since the last log lack (`record_policy_loss_term`).
    """

    reads_steps: bool = True
    step_sums: RecordedSums = field(default_factory=RecordedSums)
    log_sums: dict[str, RecordedSums] = field(default_factory=lambda: _modes(RecordedSums))
    counts: dict[str, MicroBatchCounts] = field(default_factory=lambda: _modes(MicroBatchCounts))
    last_beta: dict[str, BetaInUse] = field(default_factory=dict)
    zero_std_fractions: list[float] = field(default_factory=list)
    policy_loss_terms: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=lambda: _modes(list))

    def start_run(self) -> None:
        """A new `train()` call: an exception (e.g. from a reward function) can interrupt an optimizer step after some
        of its micro-batches were recorded, and those partial sums must not leak into the next run."""
        self.step_sums = RecordedSums()
        self.log_sums = _modes(RecordedSums)
        self.counts = _modes(MicroBatchCounts)
        self.zero_std_fractions = []
        self.policy_loss_terms = _modes(list)

    def record(self, sums: torch.Tensor | PendingSums | None, mode: str, beta: float, scale: float) -> None:
        """Keeps one micro-batch's `(5, B)` per-sequence sums (`PendingSums`: to be computed when read; None: scored
        without the reference) and the β it applied."""
        self.last_beta[mode] = BetaInUse(beta, scale)
        self.counts[mode].scored += 1
        if sums is None:
            self.counts[mode].skipped += 1
            return
        self.log_sums[mode].add(sums)
        if mode == "train" and self.reads_steps:
            self.step_sums.add(sums)

    def record_policy_loss_term(self, mode: str, place: int, term: torch.Tensor) -> None:
        """The KL term (β·Agg(f(k)), a detached scalar) that TRL's `policy_loss` of `mode` at index `place` of its
        metric list lacks, because the host computed it without: added by `write_policy_loss_terms` at the log."""
        self.policy_loss_terms[mode].append((place, term))

    def write_policy_loss_terms(
        self, metrics: dict[str, list[float]], mode: str, gather: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Adds the KL terms recorded since the last log to TRL's `policy_loss` entries, each averaged over the
        processes as TRL averages a micro-batch's loss (`gather`, then the mean of those not NaN)."""
        terms, self.policy_loss_terms[mode] = self.policy_loss_terms[mode], []
        if not terms:
            return
        places, values = zip(*terms)
        averaged = gather(torch.stack(values)).view(-1, len(values)).nanmean(0).tolist()  # (processes, M) → M
        policy_losses = metrics.get("policy_loss", [])
        for place, value in zip(places, averaged):
            if place < len(policy_losses):  # else TRL's metric store was cleared by hand since: nothing to complete
                policy_losses[place] += value

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
        self,
        metrics: dict[str, list[float]],
        mode: str,
        sum_over_processes: Callable[[torch.Tensor], torch.Tensor],
        host_kl: bool = False,
    ) -> bool:
        """Writes the `adaptive_kl/*` metrics of the micro-batches since the last log into TRL's `metrics` of `mode`
        (which it averages, and prefixes with `eval_` in evaluation), their statistics summed by `sum_over_processes`,
        then starts the next log's sums. With `host_kl`, also TRL's `kl` of each of those micro-batches, as TRL's GRPO
        appends it (`host_kl_mean`), for a trainer whose host's loss ran without its KL term. Returns whether it
        wrote any: False when no micro-batch went through the loss since the last log."""
        counts = self.counts[mode]
        if not counts.scored:
            return False
        beta, scale = self.last_beta[mode]
        recorded = self.log_sums[mode]
        stats = recorded.statistics()
        if stats is not None:  # the KL metrics: from the micro-batches scored with the reference only
            if host_kl:  # one reduction: the statistics, then each micro-batch's totals
                totals = recorded.micro_batch_totals()
                summed = sum_over_processes(torch.cat([stats, totals.flatten()]))
                stats, totals = summed[: stats.numel()], summed[stats.numel() :].view_as(totals)
                metrics["kl"].extend(host_kl_mean(totals))
            else:
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
