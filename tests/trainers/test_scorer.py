"""The CPU stand-in for TRL 1.15's fused scorer (`adaptive_kl.trainers.scorer`): installed only where training runs on
a CPU and TRL's kernel fails there, never on a GPU. TRL's scorer is replaced by a stand-in that fails like the Triton
kernel does off a GPU, so the test means the same on TRL 1.15 (Triton only) and 1.16 (which falls back to torch)."""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils

from adaptive_kl.trainers import scorer as scorer_module
from adaptive_kl.trainers.scorer import TorchLogProbFunction, install_cpu_scorer_if_needed


class KernelWithoutDriver:
    """Fails as TRL 1.15's Triton kernel fails on a machine where it cannot run."""

    calls: list = []

    @classmethod
    def apply(cls, hidden, *args):
        cls.calls.append(hidden.device.type)
        raise RuntimeError("0 active drivers ([]). There should only be one.")


@pytest.fixture
def failing_kernel(monkeypatch):
    KernelWithoutDriver.calls = []
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", KernelWithoutDriver, raising=False)
    return KernelWithoutDriver


def test_on_a_cpu_the_failing_kernel_is_replaced(failing_kernel, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    note = install_cpu_scorer_if_needed()
    assert failing_kernel.calls == ["cpu"]
    assert trl_utils._ChunkedLogProbFunction is TorchLogProbFunction and "plain-torch stand-in" in note


def test_a_simulated_gpu_machine_keeps_trls_scorer(failing_kernel, monkeypatch):
    """CUDA available: the kernel is probed on the GPU (here it fails, as no CUDA tensor can be made on this CPU),
    and whatever the probe says the stand-in is not installed; a warning names the failure."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(RuntimeWarning, match="fused LM-head scorer failed on cuda"):
        assert install_cpu_scorer_if_needed() is None
    assert trl_utils._ChunkedLogProbFunction is KernelWithoutDriver


def test_training_on_the_cpu_of_a_gpu_machine_gets_the_stand_in(failing_kernel, monkeypatch):
    """`use_cpu=True` on a GPU machine: the command passes device "cpu", and the kernel fails there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert install_cpu_scorer_if_needed("cpu") is not None
    assert failing_kernel.calls == ["cpu"] and trl_utils._ChunkedLogProbFunction is TorchLogProbFunction


def test_a_working_kernel_is_kept(monkeypatch):
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TorchLogProbFunction, raising=False)
    assert install_cpu_scorer_if_needed("cpu") is None and trl_utils._ChunkedLogProbFunction is TorchLogProbFunction


def test_trl_115_without_triton_gets_the_stand_in_on_a_cpu(monkeypatch):
    """TRL 1.15 binds its scorer to None when Triton is not installed: on a CPU that is replaced too."""
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert install_cpu_scorer_if_needed() is not None and trl_utils._ChunkedLogProbFunction is TorchLogProbFunction


def test_no_fused_scorer_nothing_to_do(monkeypatch):
    monkeypatch.delattr(trl_utils, "_ChunkedLogProbFunction", raising=False)
    assert install_cpu_scorer_if_needed() is None and "_ChunkedLogProbFunction" not in vars(trl_utils)


def test_the_stand_in_matches_a_float64_log_softmax():
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 5, 8, generator=generator), torch.randn(11, 8, generator=generator)
    targets = torch.randint(0, 11, (3, 5), generator=generator)
    log_probs, *_ = TorchLogProbFunction.apply(hidden, weight, None, targets, 0.7, 4096)
    expected = torch.log_softmax((hidden.double() @ weight.double().T) / 0.7, -1).gather(-1, targets[..., None])
    torch.testing.assert_close(log_probs.double(), expected.squeeze(-1), rtol=0, atol=1e-5)
    assert scorer_module.OPTIONAL_OUTPUTS == ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
