"""Measures a named policy's step-0 card on its demo task: greedy accuracy, format rate and completion length.

    python scripts/measure_policy_card.py smollm2 --output docs/real_model/smollm2_card.json

The card is what `reference_policy.json` is for the embedded policy: the starting point every run of the real-model
demo and studies begins from, measured on the demo's validation problems with the demo's generation budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive_kl.demo.budgets import POLICY_DEMOS  # noqa: E402
from adaptive_kl.metrics.environment import environment_lines  # noqa: E402
from adaptive_kl.tasks import evaluate_accuracy  # noqa: E402
from adaptive_kl.tasks.chat import CHAT_INSTRUCTION, CHAT_TASK, chat_datasets  # noqa: E402
from adaptive_kl.tasks.policies import resolve_policy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("policy", choices=sorted(POLICY_DEMOS))
    parser.add_argument("--n-validation", type=int, help="validation problems (default: the demo's)")
    parser.add_argument("--output", required=True)
    opts = parser.parse_args()
    demo = POLICY_DEMOS[opts.policy]
    n = opts.n_validation or demo["n_validation"]
    path = resolve_policy(opts.policy)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    _, validation = chat_datasets(1, n)
    start = time.perf_counter()
    scores = evaluate_accuracy(
        model, tokenizer, validation["prompt"], validation["answer"], demo["max_new_tokens"], batch_size=32
    )
    card = {
        "policy": opts.policy,
        "task": {**CHAT_TASK, "instruction": CHAT_INSTRUCTION, "n_validation": n},
        "greedy_max_new_tokens": demo["max_new_tokens"],
        **{f"step0_{name}": round(value, 4) for name, value in scores.items()},
        "wall_time_s": round(time.perf_counter() - start, 1),
        "environment": environment_lines("python " + " ".join(sys.argv)),
    }
    os.makedirs(os.path.dirname(os.path.abspath(opts.output)), exist_ok=True)
    with open(opts.output, "w") as f:
        json.dump(card, f, indent=2)
        f.write("\n")
    print(json.dumps(card, indent=2))


if __name__ == "__main__":
    main()
