"""With every KL field at its default, `AdaptiveKLGRPOTrainer` is stock TRL's `GRPOTrainer` bit for bit: the loss,
every parameter's gradient and every value TRL logs are `torch.equal` to stock's, for every loss type and importance
sampling level, with and without the bias correction, in float32 and bfloat16, at β = 0 and β > 0, on a batch whose
log-ratios reach ±30, and with TRL's entropy bonus on (its `policy_loss` metric). The package only measures the KL
for its own `adaptive_kl/*` metrics, which TRL does not log.

Before the host kept its own KL term at the defaults (64a9861), the package added its k3, computed as expm1(−r) + r
where TRL computes exp(x) − x − 1, to the host's β = 0 loss: equal to float precision only, and these tests fail
there.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_parity import CASES, configure, far_from_the_reference
from tiny import fabricated_inputs, loss_and_grads, make_trainer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.hooks import metric_store
from adaptive_kl.trainers.lifecycle import KLMonitor


HAS_ENTROPY_BONUS = "entropy_coef" in {f.name for f in dataclasses.fields(GRPOConfig)}  # TRL 1.16 on


@pytest.fixture(scope="module", params=[(torch.float32, 0.04), (torch.bfloat16, 0.04), (torch.float32, 0.0)],
                ids=["float32", "bfloat16", "beta-0"])  # fmt: skip
def trainers(request, tiny_model_dir):
    dtype, beta = request.param
    entropy = {"entropy_coef": 0.01} if HAS_ENTROPY_BONUS else {}
    pair = tuple(
        make_trainer(cls, config_cls, tiny_model_dir, beta=beta, bf16=False, **entropy)
        for cls, config_cls in ((GRPOTrainer, GRPOConfig), (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig))
    )
    for trainer in pair:
        trainer.model.to(dtype)
    return pair


def logged(trainer) -> dict[str, list[float]]:
    """What the trainer's loss wrote to TRL's metric store (train mode), and a fresh store for the next call."""
    store = metric_store(trainer, "train")
    values = {key: list(values) for key, values in store.items() if values}
    store.clear()
    return values


def assert_bitwise(stock, ours, inputs) -> None:
    stock_loss, stock_grads = loss_and_grads(stock, inputs)
    stock_logged = logged(stock)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    our_logged = logged(ours)
    assert torch.equal(our_loss, stock_loss), (our_loss.item(), stock_loss.item())
    assert our_grads.keys() == stock_grads.keys() and stock_grads
    unequal = [name for name in stock_grads if not torch.equal(our_grads[name], stock_grads[name])]
    assert not unequal, unequal
    assert our_logged == stock_logged  # every value, `kl` and `policy_loss` included; nothing added or removed
    if stock.beta > 0:
        assert stock_logged["kl"] and stock_logged["kl"][0] > 0
    if HAS_ENTROPY_BONUS:
        assert "policy_loss" in stock_logged


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_defaults_are_stock_bit_for_bit(trainers, loss_type, level, bias):
    stock, ours = trainers
    configure(trainers, loss_type, level, bias)
    for trainer in trainers:
        logged(trainer)  # a clean store
    assert_bitwise(stock, ours, fabricated_inputs(stock))


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_defaults_are_stock_bit_for_bit_past_log_ratios_of_20(trainers, loss_type, level, bias):
    stock, ours = trainers
    configure(trainers, loss_type, level, bias)
    for trainer in trainers:
        logged(trainer)
    assert_bitwise(stock, ours, far_from_the_reference(fabricated_inputs(stock, seed=2)))


def test_the_defaults_measure_the_kl_without_touching_the_loss(trainers):
    """The host keeps its own term (`host_kl_term`), and the package still measures it: the statistics of the
    micro-batch reach the KL monitor, whose `adaptive_kl/raw_kl` is the mean k3 of TRL's logged `kl` (one micro-batch,
    no bias correction: the same mean, to float precision)."""
    stock, ours = trainers
    configure(trainers, "grpo", "token", False)
    assert ours.host_kl_term and not ours.logs_host_kl
    logged(ours)
    ours.kl_monitor = KLMonitor(reads_steps=ours.reads_step_kl)
    loss_and_grads(ours, fabricated_inputs(ours, seed=5))
    trl_kl = logged(ours).get("kl")
    metrics = {}
    ours.kl_monitor.write_metrics(metrics, "train", ours.sum_over_processes)
    if ours.beta == 0:
        assert trl_kl is None and "adaptive_kl/raw_kl" not in metrics
        return
    assert metrics["adaptive_kl/raw_kl"][0] == pytest.approx(trl_kl[0], rel=1e-5)


@pytest.fixture(scope="module")
def beta_adapting(tiny_model_dir):
    """Ours with `kl_scaling="sqrt"` (β_t = β/√t) at optimizer step 4, and stock at that β, 0.02."""
    entropy = {"entropy_coef": 0.01} if HAS_ENTROPY_BONUS else {}
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, beta=0.04, bf16=False, **entropy)
    ours = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        beta=0.04,
        bf16=False,
        kl_scaling="sqrt",
        **entropy,
    )
    ours.state.global_step = 3  # the optimizer step in progress is the 4th
    stock.beta = ours.beta_controller.beta(4)
    return stock, ours


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_an_adaptation_of_beta_alone_is_stock_at_that_beta_bit_for_bit(beta_adapting, loss_type, level, bias):
    """Where the KL fields choose β_t only (here a schedule; a controller or `dynamic` alike), the host keeps its own
    term at β_t: the loss, gradients and logged values are stock's at that β, bit for bit, not only to float
    precision as the package's own term would give (`test_parity.py`)."""
    stock, ours = beta_adapting
    assert ours.host_kl_term and stock.beta == 0.02
    configure(beta_adapting, loss_type, level, bias)
    for trainer in beta_adapting:
        logged(trainer)
    assert_bitwise(stock, ours, far_from_the_reference(fabricated_inputs(stock, seed=7)))
