"""`kl_mask_zero_std_groups` in the trainer (TRL issue #5588): the KL of zero-std groups left out of the loss.

The loss with the mask is checked against stock TRL's policy loss (β = 0) plus β times the masked KL term computed
here from a plain float64 forward, for every loss type, in loss and gradients; the decision per group and its path
through TRL's shuffle and split into micro-batches on real training runs; the issue's own situation (a group whose
rewards all agree, whose completions get gradient from the KL only) end to end; and the reward placement.
"""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils
from test_parity import IDENTITY, REQUIRED_LEVEL, policy_only
from test_placement import GenerationRecorder, independent_advantages, reward_trainer
from test_unsloth import load_generated
from tiny import constant_reward, fabricated_inputs, loss_and_grads, make_trainer, perturb
from trl import GRPOConfig, GRPOTrainer

import adaptive_kl.trainers.grpo as trainer_module
from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.aggregation import LOSS_TYPES
from adaptive_kl.trainers.scorer import Float64LogProbFunction
from adaptive_kl.trainers.unsloth import CapturingEfficientGRPO, prepare_unsloth_host


BETA = 0.3  # test_parity's: `policy_only` puts the stock trainer's β back to it
# The KL computed here comes from another graph than TRL's (a full forward, not TRL's scorer), and Qwen2's RMSNorm
# computes in float32 even in a float64 model: the two differ by up to ~1e-7 relative. The mask moves the loss and
# gradients by more than 1e-2 relative (checked below), a wrong normalizer by more than 1e-6.
RTOL = 1e-6
KEEP = [True, False, True, False]  # fabricated_inputs' rows have 6, 4, 1 and 3 tokens: a short and a long one masked


@pytest.fixture(scope="module")
def trainers(tiny_model_dir):
    """Stock TRL, ours without the mask and ours with it, on the same weights, in float64. Without the mask, ours
    computes its own term through an adaptation that changes nothing (`IDENTITY`): at the defaults the host keeps its
    own, and the mask's path is the package's term with its rows masked."""
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, beta=BETA)
    plain = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=BETA, **IDENTITY)
    masked = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=BETA, kl_mask_zero_std_groups=True
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbFunction)
        for trainer in (stock, plain, masked):
            trainer.model.double()
        yield stock, plain, masked


def configure(trainers, loss_type):
    for trainer in trainers:
        trainer.loss_type = loss_type
        trainer.importance_sampling_level = REQUIRED_LEVEL.get(loss_type, "token")
        trainer.args.use_bias_correction_kl = False


def with_mask(inputs, keep):
    return {**inputs, "kl_group_mask": torch.tensor(keep, device=inputs["completion_ids"].device)}


def masked_kl_by_hand(trainer, inputs, keep, loss_type, train):
    """Agg(k3) of the rows `keep` says, from the definition: a plain float64 forward, loops over rows and tokens, and
    the normalizers of TRL's `_compute_loss` for the whole micro-batch (masked rows' tokens and rows counted).
    Differentiable through the model's parameters."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    n = inputs["completion_ids"].size(1)
    logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -n - 1 : -1].double()
    logps = (logits / trainer.temperature).log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1))[..., 0]
    mask, ref = inputs["completion_mask"].double(), inputs["ref_per_token_logps"].double()
    rows, width = logps.shape
    sums, lengths = [], []
    for i in range(rows):
        total = logps.new_zeros(())
        for t in range(width):
            if keep[i] and mask[i, t]:
                r = logps[i, t] - ref[i, t]
                total = total + torch.exp(-r) + r - 1
        sums.append(total)
        lengths.append(float(mask[i].sum()))
    accumulation = 2.0 if train else 1.0  # `loss_and_grads`' accumulation steps; none in evaluation
    if loss_type in ("grpo", "sapo"):
        return sum(s / max(n_i, 1.0) for s, n_i in zip(sums, lengths)) / rows / accumulation
    if loss_type == "bnpo":
        return sum(sums) / max(sum(lengths), 1.0) / accumulation
    if loss_type == "dr_grpo":
        return sum(sums) / (rows * trainer.max_completion_length) / accumulation
    if loss_type in ("dapo", "cispo", "vespo"):  # num_items_in_batch / processes · G / S (in training)
        normalizer = float(inputs["num_items_in_batch"]) / trainer.accelerator.num_processes
        if train:
            normalizer = normalizer * accumulation / trainer.args.steps_per_generation
        return sum(sums) / normalizer
    if loss_type == "luspo":
        return sum(sums) / rows / accumulation
    raise AssertionError(loss_type)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_masked_loss_is_the_policy_loss_plus_the_masked_term(trainers, loss_type, train):
    stock, plain, masked = trainers
    configure(trainers, loss_type)
    inputs = fabricated_inputs(stock, seed=3)
    loss, grads = loss_and_grads(masked, with_mask(inputs, KEEP), train=train)
    policy_loss, policy_grads = policy_only(stock, inputs, train=train)

    masked.model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        kl = masked_kl_by_hand(masked, inputs, KEEP, loss_type, train)
    expected = policy_loss + BETA * kl.detach()
    assert abs(loss - expected).item() <= RTOL * max(abs(expected).item(), abs(policy_loss).item())
    unmasked, unmasked_grads = loss_and_grads(plain, inputs, train=train)
    assert abs(unmasked - loss).item() > 1e-3 * abs(unmasked).item()  # the mask changed the loss
    if not train:
        return
    moved = sum((unmasked_grads[n] - grads[n]).norm() ** 2 for n in grads) ** 0.5
    assert moved > 1e-2 * sum(g.norm() ** 2 for g in grads.values()) ** 0.5  # and the gradient
    kl.backward()
    kl_grads = {name: p.grad for name, p in masked.model.named_parameters() if p.grad is not None}
    assert grads.keys() == policy_grads.keys() and grads
    for name, grad in grads.items():
        expected_grad = policy_grads[name] + BETA * kl_grads.get(name, torch.zeros_like(grad))
        difference = (grad - expected_grad).norm().item()
        assert difference <= RTOL * max(expected_grad.norm().item(), policy_grads[name].norm().item(), 1e-30), name


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_no_zero_std_group_leaves_the_loss_exactly_unmasked(trainers, loss_type):
    stock, plain, masked = trainers
    configure(trainers, loss_type)
    inputs = fabricated_inputs(stock, seed=4)
    loss, grads = loss_and_grads(masked, with_mask(inputs, [True] * 4))
    plain_loss, plain_grads = loss_and_grads(plain, inputs)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys() and all(torch.equal(grads[n], plain_grads[n]) for n in grads)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_group_zero_std_gives_the_policy_only_gradient(trainers, loss_type):
    """TRL issue #5588 on one micro-batch: every group's rewards agree, so every advantage is 0. Stock TRL still
    moves the policy (the KL's gradient alone); with the mask the gradient is the β = 0 one, which is 0."""
    stock, plain, masked = trainers
    configure(trainers, loss_type)
    inputs = {**fabricated_inputs(stock, seed=5)}
    inputs["advantages"] = torch.zeros_like(inputs["advantages"])
    loss, grads = loss_and_grads(masked, with_mask(inputs, [False] * 4))
    policy_loss, policy_grads = policy_only(stock, inputs)
    stock_loss, stock_grads = loss_and_grads(stock, inputs)
    assert torch.equal(loss, policy_loss) and loss.item() == 0.0
    assert grads.keys() == policy_grads.keys() and all(torch.equal(grads[n], policy_grads[n]) for n in grads)
    assert all(g.abs().max().item() == 0.0 for g in grads.values())
    assert stock_loss.item() > 0 and max(g.abs().max().item() for g in stock_grads.values()) > 1e-4


# --- on real training runs -------------------------------------------------------------------------------------------


def train_one_step(trainer) -> dict[str, torch.Tensor]:
    """Trains one step from a policy moved away from the reference (so that the KL has a gradient); returns the
    parameters before it."""
    perturb(trainer.model)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    return before


def test_issue_5588_constant_rewards_train_nothing_with_the_mask(tiny_model_dir, tmp_path):
    """The issue's situation end to end: every completion gets the same reward, so every group has zero std and zero
    advantages. Stock TRL with β > 0 still updates the weights, from the KL alone; with the mask nothing moves, while
    the KL is still measured."""
    kwargs = dict(beta=0.2, bf16=False, max_steps=1, reward_funcs=(constant_reward,))
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "stock"), **kwargs)
    before = train_one_step(stock)
    assert any(not torch.equal(before[n], p) for n, p in stock.model.named_parameters())
    assert stock.state.log_history[0]["frac_reward_zero_std"] == 1.0

    ours = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / "ours"),
        kl_mask_zero_std_groups=True,
        **kwargs,
    )
    before = train_one_step(ours)
    assert all(torch.equal(before[n], p) for n, p in ours.model.named_parameters())
    log = ours.state.log_history[0]
    assert log["adaptive_kl/kl_masked_fraction"] == 1.0 and log["grad_norm"] == 0.0
    assert log["adaptive_kl/raw_kl"] > 1e-4 and log["kl"] > 1e-4  # measured over every token, masked or not


def half_constant_reward(prompts, completions, **kwargs):
    """Prompts `i+…` with i even get the same reward for every completion (zero std); the others reward shortness."""
    return [1.0 if int(p.split("+")[0]) % 2 == 0 else 1.0 / (1.0 + len(c)) for p, c in zip(prompts, completions)]


def groups_agree(rewards: list[float], group: int) -> list[bool]:
    """Per completion: whether all rewards of its group are equal (these rewards are exact fractions or 1)."""
    return [len(set(rewards[i - i % group : i - i % group + group])) == 1 for i in range(len(rewards))]


def test_the_mask_is_decided_per_group_and_follows_each_completion_into_its_micro_batch(
    tiny_model_dir, tmp_path, monkeypatch
):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        reward_funcs=(half_constant_reward,),
        beta=0.1,
        bf16=False,
        per_device_train_batch_size=8,
        steps_per_generation=2,  # each generation batch (4 groups of 4) is shuffled and split into 2 micro-batches
        max_steps=4,
        kl_mask_zero_std_groups=True,
        output_dir=str(tmp_path / "out"),
    )
    recorder = GenerationRecorder(trainer)
    passed = []
    original_term = trainer_module.kl_term_and_sequence_sums

    def spy(*args, sequence_mask, **kwargs):
        passed.append(sequence_mask.clone())
        return original_term(*args, sequence_mask=sequence_mask, **kwargs)

    monkeypatch.setattr(trainer_module, "kl_term_and_sequence_sums", spy)
    micro_batches = []
    original_loss = trainer.compute_loss

    def recording_loss(model, inputs, *args, **kwargs):
        batch = recorder.batches[-1]  # the generation batch this micro-batch was split from
        rows = {
            (tuple(p.tolist()), tuple(c.tolist())): keep
            for p, c, keep in zip(
                batch["output"]["prompt_ids"], batch["output"]["completion_ids"], batch["expected_keep"]
            )
        }
        expected = [
            rows[(tuple(p.tolist()), tuple(c.tolist()))]
            for p, c in zip(inputs["prompt_ids"], inputs["completion_ids"])
        ]
        micro_batches.append((inputs["kl_group_mask"].tolist(), expected))
        return original_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording_loss
    original_generate = trainer._generate_and_score_completions

    def recorded(inputs):  # the expected mask, from the recorded rewards, in the generation batch's own order
        output = original_generate(inputs)
        batch = recorder.batches[-1]
        batch["expected_keep"] = [not agree for agree in groups_agree(batch["rewards"].tolist(), 4)]
        return output

    trainer._generate_and_score_completions = recorded
    trainer.train()

    assert len(recorder.batches) == 2 and len(micro_batches) == 4 and len(passed) == 4
    fractions = []
    for batch in recorder.batches:
        keep = batch["output"]["kl_group_mask"].tolist()
        assert keep == batch["expected_keep"]
        fractions.append(1 - sum(keep) / len(keep))
    every_row = [k for batch in recorder.batches for k in batch["expected_keep"]]
    assert True in every_row and False in every_row  # both kinds of group, or the test could not fail
    for (got, expected), sent in zip(micro_batches, passed):
        assert got == expected and sent.tolist() == got
    logged = [
        h["adaptive_kl/kl_masked_fraction"] for h in trainer.state.log_history if "adaptive_kl/kl_masked_fraction" in h
    ]
    assert logged == pytest.approx(fractions)


# --- with the KL in the reward ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_in_the_reward_zero_std_groups_carry_no_penalty(tiny_model_dir, tmp_path, scale):
    trainer = reward_trainer(
        tiny_model_dir,
        tmp_path,
        scale_rewards=scale,
        kl_mask_zero_std_groups=True,
        reward_funcs=(half_constant_reward,),
        per_device_train_batch_size=8,
    )
    perturb(trainer.model)  # away from the reference: a penalty that is not ~0
    recorder = GenerationRecorder(trainer)
    trainer.train()
    penalized_would_move, kinds = False, set()
    for batch in recorder.batches:
        out, rewards = batch["output"], batch["rewards"].double()
        keep = [not agree for agree in groups_agree(rewards.tolist(), trainer.num_generations)]
        assert out["kl_group_mask"].tolist() == keep
        kinds.update(keep)
        log_ratio = batch["logps"] - out["ref_per_token_logps"].double()
        penalty = 0.2 * (log_ratio * out["completion_mask"].double()).sum(-1)  # β · Σ_t k1
        kept_penalty = penalty * torch.tensor(keep, dtype=torch.float64)
        expected = independent_advantages((rewards - kept_penalty).tolist(), trainer.num_generations, scale)
        assert out["advantages"].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-5)
        for i, kept in enumerate(keep):
            if not kept:
                assert out["advantages"][i].item() == 0.0  # the zero-std groups keep zero advantages
        unmasked = independent_advantages((rewards - penalty).tolist(), trainer.num_generations, scale)
        penalized_would_move |= max(abs(a) for a, k in zip(unmasked, keep) if not k) > 1e-3
    assert kinds == {True, False}, "both kinds of group, or the test could not fail"
    assert penalized_would_move, "the penalty alone never moved a zero-std group: the test could not fail"
    fractions = [
        h["adaptive_kl/kl_masked_fraction"] for h in trainer.state.log_history if "adaptive_kl/kl_masked_fraction" in h
    ]
    assert len(fractions) == len(recorder.batches) and 0 < sum(fractions) < len(fractions)


# --- the config and the backends -------------------------------------------------------------------------------------


def config(**kwargs):
    return AdaptiveKLGRPOConfig(output_dir="unused", report_to="none", use_cpu=True, **kwargs)


def test_the_mask_is_an_adaptation_and_needs_beta():
    """Like the KL selectors, it changes what the KL does, so it needs β > 0 (docs/errors.md)."""
    assert not config().kl_mask_zero_std_groups and config(beta=0.1, kl_mask_zero_std_groups=True).uses_adaptive_kl
    with pytest.raises(ValueError, match=r"beta must be > 0 .*kl_mask_zero_std_groups=True\)"):
        config(kl_mask_zero_std_groups=True)
    with pytest.raises(ValueError, match="kl_mask_zero_std_groups must be True or False, got 'yes'"):
        config(beta=0.1, kl_mask_zero_std_groups="yes")


def test_unsloth_refuses_the_mask_before_installing_anything(tmp_path):
    module = load_generated(tmp_path, name="UnslothGRPOTrainer_mask_standin")
    trainer_cls = type("AdaptiveKLGRPOTrainer", (module.UnslothGRPOTrainer,), {})
    with pytest.raises(ValueError, match="kl_mask_zero_std_groups=True is not supported on Unsloth"):
        prepare_unsloth_host(trainer_cls, "loss", True)
    assert not isinstance(module.UnslothEfficientGRPO, CapturingEfficientGRPO)
    assert prepare_unsloth_host(trainer_cls, "loss", False) is module  # the same host without the mask is accepted
