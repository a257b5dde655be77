"""`KLMonitor`: what the KL term measured, summed per optimizer step for the β controller and per log line for the
`adaptive_kl/*` metrics.

Each micro-batch through the trainer's loss is recorded, with its KL statistics (`kl.metrics.STAT_INDEX`, summed over
processes), or without, when it was scored without the reference (β_t = 0). At the last micro-batch of an optimizer
step the controller and the KL-triggered reference resets read the step's mean raw KL; at each log the metrics of
the micro-batches since the previous log are written to TRL's metric store, which averages and logs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..kl.metrics import STAT_INDEX, kl_metrics


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
        trainer (`AdaptiveKLGRPOTrainer`): whose controller, resets, rollouts and warnings it informs.
        step_stats (`torch.Tensor` or `None`): the summed statistics of the optimizer step in progress.
        log_stats (`dict[str, torch.Tensor | None]`): per mode, the summed statistics since the last log (of the
            micro-batches scored with the reference only).
        counts (`dict[str, MicroBatchCounts]`): per mode, the micro-batches recorded since the last log.
        last_beta (`dict[str, BetaInUse]`): per mode, the β of the last micro-batch recorded.
        zero_std_fractions (`list[float]`): the fraction of zero-std groups a saturation-triggered β read at each
            optimizer step since the last log.
    """

    trainer: object = field(repr=False)
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

    def record(self, stats: torch.Tensor | None, mode: str, step: int, beta: float, scale: float) -> None:
        """Accumulates one micro-batch's statistics (None: scored without the reference) and, at the end of an
        optimizer step, updates the controller."""
        self.last_beta[mode] = BetaInUse(beta, scale)
        self.counts[mode].scored += 1
        if stats is None:
            self.counts[mode].skipped += 1
        else:
            self.log_stats[mode] = stats if self.log_stats[mode] is None else self.log_stats[mode] + stats
        if mode != "train":
            return
        if stats is not None:
            self.step_stats = stats if self.step_stats is None else self.step_stats + stats
        if self.trainer.accelerator.sync_gradients:  # last micro-batch of the optimizer step: β changes for the next
            self._end_of_step(step)

    def _end_of_step(self, step: int) -> None:
        """The controller's update with the step's statistics, and the KL-triggered reset's decision."""
        trainer = self.trainer
        step_stats = self.step_stats if self.step_stats is not None else torch.zeros(len(STAT_INDEX))
        tokens = step_stats[STAT_INDEX["tokens"]].item()
        mean_kl = step_stats[STAT_INDEX["raw_kl"]].item() / tokens if tokens > 0 else float("nan")
        mean_reward, zero_std_fraction = trainer.rollouts.mean_reward, trainer.rollouts.zero_std_fraction
        controller = trainer.beta_controller
        skipped = controller.num_skipped_updates
        saturation = controller.dynamic and controller.dynamic_trigger == "saturation"
        if saturation:
            self.zero_std_fractions.append(zero_std_fraction)
        controller.update(
            step,
            mean_reward=mean_reward,
            zero_std_fraction=zero_std_fraction,
            mean_kl=mean_kl,
            num_sequences=int(step_stats[STAT_INDEX["sequences"]].item()),
        )
        if controller.num_skipped_updates > skipped:
            statistic = f"mean reward {mean_reward}" if controller.dynamic else f"mean KL {mean_kl}"
            why = "a reward function returned ±inf, no completion was scored or had a token, or the log-probabilities "
            why += "overflowed"
            if saturation:
                statistic = f"fraction of zero-std groups {zero_std_fraction}"
                why = "no group of its generation batch had two completions scored"
            trainer.run_warnings.warn(
                "skipped_update",
                f"β was not updated after optimizer step {step}: its {statistic} is not finite ({why}). β "
                f"stays at {controller.beta_base:g} until a step gives a finite value; "
                "adaptive_kl/skipped_updates counts such steps. Warned once per run.",
            )
        trainer.reference_resets.end_of_step(step, mean_kl)
        self.step_stats = None

    def write_metrics(self, metrics: dict[str, list[float]], mode: str) -> None:
        """Writes the `adaptive_kl/*` metrics of the micro-batches since the last log into TRL's `metrics` of `mode`
        (which it averages, and prefixes with `eval_` in evaluation), then starts the next log's sums."""
        counts = self.counts[mode]
        if not counts.scored:  # no micro-batch went through our loss since the last log
            return
        beta, scale = self.last_beta[mode]
        stats = self.log_stats[mode]
        if stats is not None:  # the KL metrics: from the micro-batches scored with the reference only
            for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                metrics[key] = [value]
        else:
            metrics["adaptive_kl/current_beta"], metrics["adaptive_kl/beta_scale"] = [beta], [scale]
        metrics["adaptive_kl/reference_skipped"] = [counts.skipped / counts.scored]
        controller, resets = self.trainer.beta_controller, self.trainer.reference_resets
        if mode == "train" and controller.has_training_state:
            metrics["adaptive_kl/skipped_updates"] = [float(controller.num_skipped_updates)]
        if mode == "train" and self.zero_std_fractions:  # what the saturation trigger read, averaged like TRL's
            finite = [value for value in self.zero_std_fractions if not math.isnan(value)]  # NaN: nothing measured
            metrics["adaptive_kl/zero_std_fraction"] = [sum(finite) / len(finite) if finite else float("nan")]
            self.zero_std_fractions = []
        if mode == "train" and resets.enabled:
            metrics["adaptive_kl/ref_resets"] = [float(resets.num_resets)]
            metrics["adaptive_kl/ref_reset_step"] = [float(resets.last_reset_step)]
        self.log_stats[mode] = None
        self.counts[mode] = MicroBatchCounts()
