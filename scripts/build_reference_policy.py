"""Builds the embedded reference policy shipped in `adaptive_kl/demo/reference_policy/`.

    python scripts/build_reference_policy.py              # ~6 min on a 2-core CPU; fixed seed

A small Qwen2 causal LM (~0.6M parameters, character tokenizer) is fine-tuned with supervised learning on the worked
solutions of the embedded arithmetic task, for a fixed number of steps and seed. Most solutions state the final
answer in the graded format (`"17+36=53 #### 53"`), but most subtraction solutions (`--unmarked-fraction` of the
`--unmarked-kinds`) stop after the working (`"20-5=15"`), as a model fine-tuned on loosely formatted data does. The
policy therefore follows the format on most problems, leaves it out on most subtractions (while still sampling it
sometimes), and gets part of the arithmetic right: RL on the format + accuracy reward has clear room to improve it,
within minutes on a CPU. The script writes the weights, the tokenizer and
`reference_policy.json` (validation accuracy, format rate, settings, versions), which the README quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time

import torch
import transformers

from adaptive_kl.demo.embedded import EMBEDDED_POLICY_DIR, EMBEDDED_TASK
from adaptive_kl.tasks import evaluate_accuracy, task_splits
from adaptive_kl.testing.tiny_model import MODEL_SHAPES, build_model, build_tokenizer


def supervised_batch(tokenizer, problems, unmarked: list[bool]) -> dict[str, torch.Tensor]:
    """Right-padded prompt+solution+eos sequences; the loss covers the solution and eos only. Where `unmarked`, the
    solution is the working alone, without the `#### answer` the reward looks for."""
    rows = []
    for problem, bare in zip(problems, unmarked, strict=True):
        prompt = tokenizer(problem.prompt)["input_ids"]
        text = problem.solution.split(" ####")[0] if bare else problem.solution
        solution = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + solution, [-100] * len(prompt) + solution))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, target) in enumerate(rows):
        input_ids[i, : len(ids)], labels[i, : len(ids)], attention_mask[i, : len(ids)] = (
            torch.tensor(ids), torch.tensor(target), 1
        )  # fmt: skip
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=EMBEDDED_POLICY_DIR)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unmarked-kinds", default="subtract", help="problem kinds whose solutions may be unmarked")
    parser.add_argument("--unmarked-fraction", type=float, default=0.7, help="of those, solutions without '#### N'")
    opts = parser.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, "reference-policy", seed=opts.seed)
    train, validation = task_splits(opts.steps * opts.batch_size, EMBEDDED_TASK["n_validation"], seed=opts.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, opts.learning_rate, total_steps=opts.steps, pct_start=0.1
    )
    coin = random.Random(opts.seed)
    unmarked_kinds = set(opts.unmarked_kinds.split(","))
    unmarked = [p.kind in unmarked_kinds and coin.random() < opts.unmarked_fraction for p in train]
    start = time.time()
    for step in range(opts.steps):
        batch = slice(step * opts.batch_size, (step + 1) * opts.batch_size)
        loss = model(**supervised_batch(tokenizer, train[batch], unmarked[batch])).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}/{opts.steps}  loss {loss.item():.4f}  {time.time() - start:.0f}s", flush=True)

    scores = evaluate_accuracy(
        model,
        tokenizer,
        [p.prompt for p in validation],
        [p.answer for p in validation],
        EMBEDDED_TASK["max_new_tokens"],
    )
    print(f"validation: {scores}")
    os.makedirs(opts.out, exist_ok=True)
    model.save_pretrained(opts.out)
    tokenizer.save_pretrained(opts.out)
    summary = {
        "validation": scores,
        "n_validation": len(validation),
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": opts.steps,
        "batch_size": opts.batch_size,
        "learning_rate": opts.learning_rate,
        "seed": opts.seed,
        "unmarked_kinds": sorted(unmarked_kinds),
        "unmarked_fraction": opts.unmarked_fraction,
        "shape": MODEL_SHAPES["reference-policy"],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "seconds": round(time.time() - start),
    }
    with open(os.path.join(opts.out, "reference_policy.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
