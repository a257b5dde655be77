"""Each KL method has its documented effect on the loss and on the per-token gradient.

The KL part of our loss is isolated as (our loss) − (stock TRL's loss at β = 0), and its gradient with respect to
the per-token policy log-probabilities log π_θ(y_it) is compared with the closed form

    ∂/∂log π_it = β · w_it · f'(k_it) · k'(r_it)

where w_it is the aggregation weight of token t of sequence i (docs/design.md §4), written out independently below.
Bias correction is off so that k depends on log π only through r.
"""

from __future__ import annotations

import pytest
import torch
from tiny import fabricated_inputs, make_trainer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer


BETA = 0.3
ACCUMULATION = 2
CLIP, TARGET = 0.1, 0.05  # small enough that some tokens of `fabricated_inputs` are clipped / gated


def logp_gradient(trainer, inputs):
    """Loss and ∂loss/∂log π_θ at each completion token."""
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        logps.retain_grad()
        captured.setdefault("logps", logps)
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    try:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = ACCUMULATION
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    return loss.detach(), captured["logps"].detach(), captured["logps"].grad


def estimator_derivative(r, estimator):
    # The straight-through k1+/k3+ backpropagate k2's derivative, r.
    return {"k1": torch.ones_like(r), "k2": r, "k3": 1 - torch.exp(-r), "k1+": r, "k3+": r}[estimator]


def estimate(r, estimator):
    k3 = torch.exp(-r) + r - 1
    return {"k1": r, "k2": r**2 / 2, "k3": k3, "k1+": r, "k3+": k3}[estimator]


def transform_and_derivative(k, method):
    if method == "clip":
        return k.clamp(max=CLIP), (k < CLIP).float()
    if method == "sigmoid":
        s = 1 / (1 + torch.exp(-(k - TARGET)))
        return s * k, s * (1 - s) * k + s
    return k, torch.ones_like(k)


def aggregation_weights(mask, loss_type, length_normalized, inputs, max_completion_length):
    """w_it, written from docs/design.md §4 (training mode, gradient accumulation ACCUMULATION, one process)."""
    batch, _ = mask.shape
    lengths = mask.sum(1, keepdim=True)
    if length_normalized or loss_type in ("grpo", "sapo"):
        w = mask / (batch * lengths.clamp(min=1))
    elif loss_type == "bnpo":
        w = mask / mask.sum()
    elif loss_type == "dr_grpo":
        w = mask / (batch * max_completion_length)
    elif loss_type == "luspo":
        w = mask / batch
    else:  # dapo, cispo, vespo: global tokens of the generation batch, rescaled to one accumulation window
        steps_per_generation = ACCUMULATION
        return mask / (inputs["num_items_in_batch"] * ACCUMULATION / steps_per_generation)
    return w / ACCUMULATION


CASES = [
    ("none", "k3+", "dapo"),
    ("none", "k1+", "grpo"),
    ("clip", "k3+", "bnpo"),  # the clip acts on k3's value; clipped tokens carry no gradient
    ("sigmoid", "k1+", "dr_grpo"),  # the gate σ(k − τ) of k1's value, times k2's gradient
    ("length_normalized", "k3+", "dapo"),
    ("none", "k3", "dapo"),
    ("none", "k1", "grpo"),
    ("none", "k2", "bnpo"),
    ("clip", "k3", "dapo"),
    ("clip", "k2", "grpo"),
    ("sigmoid", "k3", "dr_grpo"),
    ("sigmoid", "k2", "luspo"),
    ("length_normalized", "k3", "dapo"),
    ("length_normalized", "k3", "dr_grpo"),
    ("length_normalized", "k2", "grpo"),
    ("clip+length_normalized", "k3", "dapo"),
    ("sigmoid+length_normalized", "k3", "bnpo"),
]


@pytest.mark.parametrize("method,estimator,loss_type", CASES)
def test_kl_term_and_gradient_follow_the_formula(tiny_model_dir, method, estimator, loss_type):
    level = "sequence" if loss_type == "luspo" else "token"
    common = dict(
        beta=BETA,
        loss_type=loss_type,
        importance_sampling_level=level,
        use_bias_correction_kl=False,
        gradient_accumulation_steps=ACCUMULATION,
    )
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, **common)
    ours = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        kl_adaptation_method=method,
        kl_estimator=estimator,
        kl_clip_threshold=CLIP,
        kl_target=TARGET,
        **common,
    )
    inputs = fabricated_inputs(stock)
    stock.beta = 0.0
    policy_loss, logps, policy_grad = logp_gradient(stock, inputs)
    our_loss, our_logps, our_grad = logp_gradient(ours, inputs)
    torch.testing.assert_close(our_logps, logps, rtol=0, atol=0)

    mask = inputs["completion_mask"].float()
    r = logps - inputs["ref_per_token_logps"]
    k = estimate(r, estimator)
    f, df = transform_and_derivative(k, method.split("+")[0])
    w = aggregation_weights(mask, loss_type, "length_normalized" in method, inputs, ours.max_completion_length)

    expected_term = BETA * (w * f).sum()
    torch.testing.assert_close(our_loss - policy_loss, expected_term, rtol=1e-5, atol=1e-8)
    expected_grad = BETA * w * df * estimator_derivative(r, estimator)
    torch.testing.assert_close(our_grad - policy_grad, expected_grad, rtol=1e-4, atol=1e-8)

    if method.startswith("clip"):
        clipped = (mask > 0) & (k > CLIP)
        assert clipped.any() and (~clipped & (mask > 0)).any()
        # zero KL gradient on clipped tokens, the full one elsewhere
        assert torch.equal(our_grad[clipped], policy_grad[clipped])


def method_trainer(model_dir, method: str, loss_type: str, **fields):
    """A trainer of `method` at `BETA` on the tiny model, accumulating `ACCUMULATION` micro-batches."""
    return make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        model_dir,
        beta=BETA,
        loss_type=loss_type,
        kl_adaptation_method=method,
        gradient_accumulation_steps=ACCUMULATION,
        **fields,
    )


def test_length_normalized_gives_every_sequence_equal_kl_weight_under_dapo(tiny_model_dir):
    """Under `dapo` the default KL weight of a sequence grows with its length; `length_normalized` makes it 1/B."""
    totals = {}
    for method in ("none", "length_normalized"):
        # k1: ∂k/∂log π = 1, so the gradient is the aggregation weight itself
        trainer = method_trainer(tiny_model_dir, method, "dapo", kl_estimator="k1", use_bias_correction_kl=False)
        inputs = fabricated_inputs(trainer)
        _, _, grad = logp_gradient(trainer, inputs)
        trainer.beta = 0.0
        try:
            _, _, policy_grad = logp_gradient(trainer, inputs)
        finally:
            trainer.beta = BETA
        totals[method] = (grad - policy_grad).sum(1) / BETA * ACCUMULATION  # per-sequence total KL weight
    lengths = fabricated_inputs(trainer)["completion_mask"].sum(1).float()
    torch.testing.assert_close(totals["length_normalized"], torch.full_like(lengths, 1 / len(lengths)))
    assert not torch.allclose(totals["none"], totals["none"][0].expand_as(lengths))
    torch.testing.assert_close(totals["none"] / totals["none"].sum(), lengths / lengths.sum())


def test_length_normalized_is_none_bit_for_bit_under_grpo(tiny_model_dir):
    """With k3 in the loss and `loss_type="grpo"`, the host already averages each sequence's tokens and then the
    sequences: `length_normalized` changes nothing, to the bit (why the real-model methods study runs it in the
    reward, where it acts; docs/studies/README.md)."""
    results = {}
    for method in ("clip", "length_normalized+clip"):
        # The package's term for both, through a clip that clips nothing (k3 < 1e30); where only β adapts the host
        # keeps its own term, summed in another order
        trainer = method_trainer(tiny_model_dir, method, "grpo", kl_clip_threshold=1e30)
        results[method] = logp_gradient(trainer, fabricated_inputs(trainer))
    (none_loss, _, none_grad), (ln_loss, _, ln_grad) = results["clip"], results["length_normalized+clip"]
    assert torch.equal(ln_loss, none_loss) and torch.equal(ln_grad, none_grad)
    assert none_grad.abs().sum() > 0
