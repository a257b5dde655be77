"""Reward functions of the arithmetic task, in the signature `GRPOTrainer` calls reward functions with.

The trainer calls each one as `f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)`,
where `columns` holds every other dataset column as a list (here `answer`, the gold number), and logs its mean as
`rewards/<f.__name__>/mean`: `rewards/format_reward/mean` and `rewards/accuracy_reward/mean`.

The task's "reward based on correct answer format and accuracy" is the sum of the two functions, which is what
`GRPOTrainer` computes from `reward_funcs=list(TASK_REWARDS)` with the default unit `reward_weights`:

- `format_reward`: 1 if the completion states a final answer through a marker (`#### 19` or `<answer>19</answer>`);
- `accuracy_reward`: 1 if that answer equals the gold answer.

An answer is only ever found through a marker, so a correct answer implies the format, and a completion earns 0 (no
answer in the format), 1 (formatted but wrong) or 2 (formatted and right).

`working_similarity_reward` is graded instead (a completion's similarity to the reference working, in [0, 1]): the
real-model smoke run (`adaptive-kl compare --model smollm2 --quick`) adds it, because in its 2 steps a fresh policy
rarely writes a marker, every completion of a group then earns the same task reward, and nothing would train.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any

from .answers import answers_match, completion_text, extract_answer, has_answer_format


def format_reward(completions: list[Any], **kwargs) -> list[float]:
    """1.0 for each completion that gives its final answer through `####` or an `<answer>` block, else 0.0.

    `completions` are strings or conversational message lists; other keyword arguments from the trainer are ignored.
    """
    return [float(has_answer_format(completion_text(completion))) for completion in completions]


def accuracy_reward(completions: list[Any], answer: list[str | int | float], **kwargs) -> list[float]:
    """1.0 for each completion whose extracted final answer equals its gold `answer` (the dataset column), else 0.0."""
    return [
        float(answers_match(extract_answer(completion_text(completion)), gold))
        for completion, gold in zip(completions, answer, strict=True)
    ]


def working_similarity_reward(completions: list[Any], solution: list[str], **kwargs) -> list[float]:
    """For each completion, how close its text is to the problem's reference working (the dataset column `solution`,
    e.g. `"7+12=19 #### 19"`): difflib's similarity ratio, 2·matches / total length, in [0, 1]. Two different
    completions almost never get the same value, so a group's advantages are not all 0."""
    return [
        SequenceMatcher(None, completion_text(completion), reference, autojunk=False).ratio()
        for completion, reference in zip(completions, solution, strict=True)
    ]


# Passed as `reward_funcs=list(TASK_REWARDS)`: the trainer sums them into the 0/1/2 task reward.
TASK_REWARDS = (format_reward, accuracy_reward)
