"""Forward passes per optimizer step: AdaptiveKLGRPOTrainer runs exactly as many as stock GRPOTrainer.

Forward hooks on the policy and the reference model count every call (generation steps, log-probabilities of the
old, reference and current policy) and a callback records the counts of each optimizer step. Completions are forced
to full length, so the counts do not depend on what the (diverging) weights sample.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from tiny import make_trainer
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.config import KL_METHODS


COMPLETION_LENGTH = 6
# Two micro-batches per optimizer step and two iterations per generation: old log-probabilities are computed, and
# steps 1 and 3 generate (and score with the reference) while step 2 reuses step 1's generation batch.
HOST = dict(
    beta=0.04,
    max_steps=3,
    gradient_accumulation_steps=2,
    num_iterations=2,
    max_completion_length=COMPLETION_LENGTH,
    generation_kwargs={"min_new_tokens": COMPLETION_LENGTH},
)
VARIANTS = [
    *({"kl_adaptation_method": m} for m in KL_METHODS),
    {"kl_adaptation_method": "dynamic+length_normalized", "kl_scaling": "sqrt"},
    {"kl_estimator": "k2", "kl_controller": "adaptive"},
    {"kl_adaptation_method": "clip", "use_bias_correction_kl": True},
]


class ForwardCounter(TrainerCallback):
    """Counts forward calls of the policy and of the separate reference model (if any), per optimizer step."""

    def __init__(self, trainer):
        self.calls = {"policy": 0, "reference": 0}
        self.per_step: list[tuple[int, int]] = []
        modules = {"policy": trainer.model, "reference": trainer.ref_model}
        for name, module in modules.items():
            if module is not None:
                module.register_forward_hook(self._counter(name))
        trainer.add_callback(self)

    def _counter(self, name):
        def hook(module, args, output):
            self.calls[name] += 1

        return hook

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append((self.calls["policy"], self.calls["reference"]))
        self.calls = {"policy": 0, "reference": 0}


def forward_counts(cls, config_cls, model_dir, peft_config=None, **fields):
    trainer = make_trainer(cls, config_cls, model_dir, peft_config=peft_config, **HOST, **fields)
    counter = ForwardCounter(trainer)
    trainer.train()
    return counter.per_step


@pytest.fixture(scope="module")
def stock_counts(tiny_model_dir):
    counts = forward_counts(GRPOTrainer, GRPOConfig, tiny_model_dir)
    (policy_1, reference_1), (policy_2, reference_2), step_3 = counts
    assert step_3 == (policy_1, reference_1) and reference_1 > 0
    assert reference_2 == 0 and 0 < policy_2 < policy_1  # step 2: the loss's forwards only
    return counts


@pytest.mark.parametrize("fields", VARIANTS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_forward_passes_per_step_equal_stock(tiny_model_dir, stock_counts, fields):
    assert forward_counts(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, **fields) == stock_counts


def test_forward_passes_with_lora_equal_stock(tiny_model_dir):
    """With PEFT the reference is the policy with its adapter disabled: every pass goes through one module."""
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    stock = forward_counts(GRPOTrainer, GRPOConfig, tiny_model_dir, peft_config=lora)
    ours = forward_counts(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, peft_config=lora, kl_adaptation_method="clip"
    )
    assert ours == stock
    assert all(reference == 0 and policy > 0 for policy, reference in stock)


class ExtraForwardTrainer(AdaptiveKLGRPOTrainer):
    """A trainer that wastes one policy forward per micro-batch: what the counter must catch."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        with torch.no_grad():
            model(input_ids=inputs["prompt_ids"], attention_mask=inputs["prompt_mask"])
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_counter_detects_one_extra_forward_per_micro_batch(tiny_model_dir, stock_counts):
    counts = forward_counts(ExtraForwardTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, kl_adaptation_method="clip")
    micro_batches = HOST["gradient_accumulation_steps"]
    assert counts == [(policy + micro_batches, reference) for policy, reference in stock_counts]
