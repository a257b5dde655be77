"""The embedded default: a tiny reference policy and its arithmetic task, shipped in the package (no download).

The policy (`adaptive_kl/demo/reference_policy/`, ~2.5 MB) is a 0.6M-parameter Qwen2 model with a character tokenizer,
fine-tuned by `scripts/build_reference_policy.py` to write `"17+36=53 #### 53"`-style solutions. It follows the format
except on most subtractions, and gets about half of the arithmetic right (`reference_policy.json` records its
validation accuracy: 0.385), which leaves RL room to improve it.
"""

from __future__ import annotations

import os

from ..tasks.problems import task_splits, to_dataset


EMBEDDED_POLICY_DIR = os.path.join(os.path.dirname(__file__), "reference_policy")

# The task the policy was fine-tuned on: the same generator seed gives the same train/validation split.
EMBEDDED_TASK = {"seed": 0, "n_validation": 200, "max_new_tokens": 24}


def embedded_policy_path() -> str:
    """Local path of the embedded reference policy (loadable with `from_pretrained`)."""
    if not os.path.isfile(os.path.join(EMBEDDED_POLICY_DIR, "config.json")):
        raise FileNotFoundError(
            f"The embedded reference policy is missing from {EMBEDDED_POLICY_DIR}; "
            "reinstall adaptive-kl or rebuild it with scripts/build_reference_policy.py"
        )
    return EMBEDDED_POLICY_DIR


def embedded_datasets(n_train: int, n_validation: int | None = None, seed: int = EMBEDDED_TASK["seed"]):
    """Train and validation `datasets.Dataset`s of the embedded task (columns `prompt`, `answer`, `solution`, `kind`).

    `seed` draws the train problems only. The validation problems are always those the policy was measured on (for the
    default size; a smaller set is a prefix of it), and none of them was in its fine-tuning data or is in the train
    split, whatever the seed.
    """
    train, validation = task_splits(
        n_train, n_validation or EMBEDDED_TASK["n_validation"], seed=seed, validation_seed=EMBEDDED_TASK["seed"]
    )
    return to_dataset(train), to_dataset(validation)
