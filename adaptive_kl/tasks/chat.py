"""The arithmetic task for a chat model: "What is a + b?" as a conversation, answered in GSM8K's `####` format.

A pretrained chat model (SmolLM2-135M-Instruct) is asked, as a user message rendered by its own chat template,

    What is 7 + 12? Give the final answer after ####.

and answers in its own words: greedily, about a third of its answers contain the right sum and one in ten uses the
`####` marker (`docs/real_model.md` has the measured card). The task's rewards are the embedded task's
(`format_reward` + `accuracy_reward`, 0/1/2), which read conversational completions, so RL has both a format to learn
and an accuracy to improve, and the model's long answers leave room to lengthen or shorten.

The validation problems depend only on their own seed (never on the train seed) and are disjoint from every train
split, as in the embedded task.
"""

from __future__ import annotations

from .problems import task_splits


CHAT_INSTRUCTION = "Give the final answer after ####."
# "sum": a + b with 1 ≤ a, b ≤ 20, the range the real model's step-0 card was measured on.
CHAT_TASK = {"kinds": ("sum",), "max_operand": 20, "validation_seed": 0}


def chat_datasets(n_train: int, n_validation: int, seed: int = 0):
    """Train and validation `datasets.Dataset`s of the chat task: `prompt` (a conversation), `answer`, `solution`
    (the reference working, `"7+12=19 #### 19"`) and `kind`. `seed` draws the train problems only."""
    from datasets import Dataset

    train, validation = task_splits(
        n_train,
        n_validation,
        seed=seed,
        validation_seed=CHAT_TASK["validation_seed"],
        kinds=CHAT_TASK["kinds"],
        max_operand=CHAT_TASK["max_operand"],
    )

    # The question as a chat model is asked it: one user message, with the answer format.
    return tuple(
        Dataset.from_list(
            [
                {
                    "prompt": [{"role": "user", "content": f"{p.question} {CHAT_INSTRUCTION}"}],
                    "answer": str(p.answer),
                    "solution": p.solution,
                    "kind": p.kind,
                }
                for p in problems
            ]
        )
        for problems in (train, validation)
    )
