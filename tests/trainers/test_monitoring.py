"""`KLMonitor`: a micro-batch leaves only its per-sequence sums; the statistics, summed over processes, are made when
the step's KL or a log line reads them, and what it holds stays bounded when nothing reads it."""

from __future__ import annotations

import pytest
import torch

from adaptive_kl.kl.metrics import STAT_INDEX, kl_metrics, kl_sequence_sums, kl_statistics
from adaptive_kl.kl.term import KLEstimates
from adaptive_kl.trainers.monitoring import FOLD_EVERY, KLMonitor, PendingSums


def micro_batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` micro-batches of 1 to 4 sequences, padded to different widths: `(raw KL, mask)` of each."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(count):
        rows, width = 1 + i % 4, 3 + i % 5
        lengths = torch.randint(0, width + 1, (rows,), generator=generator)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
        batches.append((torch.rand(rows, width, generator=generator, dtype=torch.float64) * 2, mask))
    return batches


def statistics_of(batches) -> torch.Tensor:
    """The statistics of every micro-batch, each computed alone, summed (as the monitor summed them before)."""
    return sum(kl_statistics(raw, raw.clamp(max=1.0), mask, clip_threshold=1.0) for raw, mask in batches)


def record(monitor: KLMonitor, batches, mode: str = "train") -> None:
    for raw, mask in batches:
        monitor.record(kl_sequence_sums(raw, raw.clamp(max=1.0), mask, clip_threshold=1.0), mode, 0.04, 1.0)


class CountingSum:
    """An identity 'sum over processes' that counts its calls (the collective a log line or a step makes)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return values


@pytest.mark.parametrize("count", [3, FOLD_EVERY - 1, FOLD_EVERY, 2 * FOLD_EVERY + 5])
def test_a_log_line_reads_the_statistics_of_every_micro_batch_recorded_in_one_reduction(count):
    """Across folds (every `FOLD_EVERY` micro-batches), the metrics of a log line are those of the statistics summed
    micro-batch by micro-batch, to float64 rounding; one reduction per line; the next line starts afresh."""
    batches = micro_batches(count)
    monitor = KLMonitor()
    record(monitor, batches)
    assert len(monitor.log_sums["train"].pending) < FOLD_EVERY  # bounded: folded into statistics as it goes
    metrics, reduce = {}, CountingSum()
    assert monitor.write_metrics(metrics, "train", reduce)
    expected = kl_metrics(statistics_of(batches), beta=0.04, beta_scale=1.0)
    assert reduce.calls == 1
    assert {key: metrics[key][0] for key in expected} == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert expected["adaptive_kl/clip_fraction"] > 0 and expected["adaptive_kl/kl_length_corr"] != 0  # not vacuous
    assert not monitor.write_metrics({}, "train", reduce)  # nothing since: no line, no reduction
    assert reduce.calls == 1


def test_the_steps_statistics_are_made_only_when_something_reads_them():
    """`end_step(None)` (constant β, no KL-triggered reset) drops the step's sums without a reduction; a reader gets
    the step's own micro-batches only, and evaluation micro-batches never enter a training step."""
    first, second = micro_batches(3, seed=1), micro_batches(2, seed=2)
    monitor, reduce = KLMonitor(), CountingSum()
    record(monitor, first)
    record(monitor, micro_batches(2, seed=3), mode="eval")
    assert monitor.end_step(None) is None and reduce.calls == 0
    record(monitor, second)
    stats = monitor.end_step(reduce)
    assert reduce.calls == 1
    torch.testing.assert_close(stats, statistics_of(second), rtol=1e-12, atol=0.0)
    assert monitor.end_step(reduce) is None and reduce.calls == 1  # a step without a scored micro-batch
    # The log line still covers both steps' micro-batches.
    metrics = {}
    monitor.write_metrics(metrics, "train", reduce)
    tokens = statistics_of(first + second)[STAT_INDEX["tokens"]]
    raw = statistics_of(first + second)[STAT_INDEX["raw_kl"]]
    assert metrics["adaptive_kl/raw_kl"][0] == pytest.approx((raw / tokens).item(), rel=1e-12)


def test_micro_batches_scored_without_the_reference_are_counted_not_summed():
    monitor, reduce = KLMonitor(), CountingSum()
    monitor.record(None, "train", 0.0, 0.0)
    metrics = {}
    assert monitor.write_metrics(metrics, "train", reduce)
    assert reduce.calls == 0 and "adaptive_kl/raw_kl" not in metrics
    assert metrics["adaptive_kl/reference_skipped"] == [1.0] and metrics["adaptive_kl/current_beta"] == [0.0]


def pending(raw: torch.Tensor, mask: torch.Tensor) -> PendingSums:
    """A micro-batch recorded as its estimates, to be measured at the log line (as the trainer records one: the
    estimates of a masked log-ratio, 0 where the mask is)."""
    raw = raw * mask
    estimates = KLEstimates(raw, raw.clamp(max=1.0), mask, 1.0, None)
    return PendingSums.of_estimates(estimates)


@pytest.mark.parametrize("count", [25, FOLD_EVERY + 3])
def test_pending_micro_batches_are_measured_together_with_the_same_statistics(count):
    """Micro-batches recorded as `PendingSums`, of several shapes and mixed with computed sums, give the statistics
    of each micro-batch computed alone (to float64 rounding), and each micro-batch's totals in the order recorded,
    across folds; the measure runs once per shape of a fold, not once per micro-batch."""
    batches = micro_batches(count, seed=4)
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["raw_kl"].shape)
        return kl_sequence_sums(*args, **kwargs)

    monitor = KLMonitor(reads_steps=False)  # as a trainer keeps them where no step reads its statistics
    for i, (raw, mask) in enumerate(batches):
        item = (
            pending(raw, mask)._replace(measure=counted)
            if i % 3
            else kl_sequence_sums(raw, raw.clamp(max=1.0), mask, clip_threshold=1.0)
        )
        monitor.record(item, "train", 0.04, 1.0)
    recorded = monitor.log_sums["train"]
    stats = recorded.statistics()
    torch.testing.assert_close(stats, statistics_of(batches), rtol=1e-12, atol=1e-15)
    expected_totals = torch.stack(
        [kl_sequence_sums(raw, raw.clamp(max=1.0), mask, clip_threshold=1.0).sum(-1) for raw, mask in batches], dim=1
    )
    torch.testing.assert_close(recorded.micro_batch_totals(), expected_totals, rtol=1e-12, atol=1e-15)
    folds = [range(start, min(start + FOLD_EVERY, count)) for start in range(0, count, FOLD_EVERY)]
    shapes_per_fold = [len({batches[i][0].shape for i in fold if i % 3}) for fold in folds]
    assert len(calls) == sum(shapes_per_fold) < sum(1 for i in range(count) if i % 3)


@pytest.mark.parametrize("one_shape", [False, True])
def test_a_log_line_writes_trls_kl_of_each_micro_batch_in_the_same_reduction(one_shape):
    """With `host_kl` (a host whose loss ran without its KL term), the line writes TRL's `kl` of every micro-batch
    (its token mean of the host's KL), in the one reduction of the statistics. Micro-batches of one shape (the usual
    line: measured in one call, without concatenating the results) or of several."""
    batches = micro_batches(4, seed=5)
    if one_shape:
        batches = [(raw[:1, :3], mask[:1, :3]) for raw, mask in batches]
    monitor, reduce = KLMonitor(), CountingSum()
    for raw, mask in batches:
        monitor.record(pending(raw, mask), "train", 0.04, 1.0)
    metrics = {"kl": []}
    assert monitor.write_metrics(metrics, "train", reduce, host_kl=True)
    expected = [((raw * mask).sum() / mask.sum().clamp(min=1.0)).item() for raw, mask in batches]
    assert reduce.calls == 1 and metrics["kl"] == pytest.approx(expected, rel=1e-12)
    expected_metrics = kl_metrics(statistics_of(batches), beta=0.04, beta_scale=1.0)
    assert {key: metrics[key][0] for key in expected_metrics} == pytest.approx(expected_metrics, rel=1e-12, abs=1e-15)


def test_the_policy_loss_gets_each_micro_batchs_term_averaged_over_processes():
    """Each recorded KL term is added to the `policy_loss` entry of its micro-batch, averaged over the processes as
    TRL averages a micro-batch's loss (NaN left out); then the record is empty."""
    monitor = KLMonitor()
    metrics = {"policy_loss": [1.0, 2.0, 3.0]}
    monitor.record_policy_loss_term("train", 0, torch.tensor(0.5))
    monitor.record_policy_loss_term("train", 2, torch.tensor(0.25))
    other_process = torch.tensor([1.5, float("nan")])

    def gather(values):  # this process's values, then another's
        return torch.cat([values, other_process])

    monitor.write_policy_loss_terms(metrics, "train", gather)
    assert metrics["policy_loss"] == [1.0 + (0.5 + 1.5) / 2, 2.0, 3.0 + 0.25]
    monitor.write_policy_loss_terms(metrics, "train", gather)  # nothing recorded since
    assert metrics["policy_loss"] == [2.0, 2.0, 3.25]
