"""`KLMonitor`: a micro-batch leaves only its per-sequence sums; the statistics, summed over processes, are made when
the step's KL or a log line reads them, in one reduction each."""

from __future__ import annotations

import pytest
import torch
from tiny import kl_statistics

from adaptive_kl.kl.metrics import STAT_INDEX, kl_metrics, kl_sequence_sums
from adaptive_kl.trainers.lifecycle import KLMonitor


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


@pytest.mark.parametrize("count", [3, 63, 64, 133])
def test_a_log_line_reads_the_statistics_of_every_micro_batch_recorded_in_one_reduction(count):
    """The metrics of a log line, over micro-batches of several shapes, are those of the statistics summed
    micro-batch by micro-batch, to float64 rounding; one reduction per line; the next line starts afresh."""
    batches = micro_batches(count)
    monitor = KLMonitor()
    record(monitor, batches)
    metrics, reduce = {}, CountingSum()
    assert monitor.write_metrics(metrics, "train", reduce)
    expected = kl_metrics(statistics_of(batches), beta=0.04, beta_scale=1.0)
    assert reduce.calls == 1
    assert {key: metrics[key][0] for key in expected} == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert expected["adaptive_kl/clip_fraction"] > 0 and expected["adaptive_kl/kl_length_corr"] != 0  # not vacuous
    assert not monitor.write_metrics({}, "train", reduce)  # nothing since: no line, no reduction
    assert reduce.calls == 1


def test_the_steps_statistics_are_kept_only_where_something_reads_them():
    """Where nothing reads a step's KL (constant β, no KL-triggered reset) the monitor keeps no step sums; a reader
    gets the step's own micro-batches only, and evaluation micro-batches never enter a training step."""
    first, second = micro_batches(3, seed=1), micro_batches(2, seed=2)
    unread = KLMonitor(reads_steps=False)
    record(unread, first)
    assert unread.step_sums == [] and len(unread.log_sums["train"]) == len(first)
    monitor, reduce = KLMonitor(), CountingSum()
    record(monitor, first)
    record(monitor, micro_batches(2, seed=3), mode="eval")
    torch.testing.assert_close(monitor.end_step(reduce), statistics_of(first), rtol=1e-12, atol=0.0)
    record(monitor, second)
    stats = monitor.end_step(reduce)
    assert reduce.calls == 2
    torch.testing.assert_close(stats, statistics_of(second), rtol=1e-12, atol=0.0)
    assert monitor.end_step(reduce) is None and reduce.calls == 2  # a step without a scored micro-batch
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
