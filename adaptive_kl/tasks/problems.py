"""A seeded generator of one- and two-step arithmetic word problems: the embedded task of the demo.

Each problem has a question, the equation that solves it and its integer answer. The solution text follows the GSM8K
convention (working, then the final answer after `####`), e.g. `"12+7=19 #### 19"`, which is what the embedded
reference policy was fine-tuned to write.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


NAMES = ["Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lena", "Max", "Nia", "Omar"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stamps", "beads", "cups"]
PROMPT_PREFIX = "Q: "
PROMPT_SUFFIX = " A: "


@dataclass(frozen=True)
class Problem:
    """One word problem. `equation` is the working (e.g. `"12+7"`), `answer` its value."""

    question: str
    equation: str
    answer: int
    kind: str = ""  # one of `KINDS`

    @property
    def prompt(self) -> str:
        return format_prompt(self.question)

    @property
    def solution(self) -> str:
        return f"{self.equation}={self.answer} #### {self.answer}"


def format_prompt(question: str) -> str:
    """The prompt the policy sees for a question (the same for the embedded task and GSM8K)."""
    return f"{PROMPT_PREFIX}{question}{PROMPT_SUFFIX}"


# The kinds of problem, each drawn in `generate_problems`; "sum" is the chat task's.
KINDS = ("add", "subtract", "multiply", "two_step", "sum")
# The word problems of the embedded task (what the embedded policy was fine-tuned on).
EMBEDDED_KINDS = ("add", "subtract", "multiply", "two_step")


def generate_problems(n: int, seed: int = 0, max_operand: int = 50, kinds=EMBEDDED_KINDS) -> list[Problem]:
    """`n` problems drawn with `random.Random(seed)`: the same arguments always give the same list.

    Args:
        n: number of problems.
        seed: seed of the generator.
        max_operand: largest number in a question (multiplication uses a single digit times up to max_operand/5).
        kinds: problem kinds to draw from, uniformly (of `KINDS`).
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"Unknown problem kinds {unknown}; allowed: {sorted(KINDS)}")
    if max_operand < 2:
        raise ValueError(f"max_operand must be at least 2, got {max_operand}")
    rng = random.Random(seed)
    kinds = list(kinds)
    problems = []
    for _ in range(n):
        kind = rng.choice(kinds)
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        if kind == "add":
            a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
            question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
            equation, answer = f"{a}+{b}", a + b
        elif kind == "subtract":
            a = rng.randint(2, max_operand)
            b = rng.randint(1, a - 1)
            question = f"{name} has {a} {item} and gives {b} away. How many {item} are left?"
            equation, answer = f"{a}-{b}", a - b
        elif kind == "multiply":
            a, b = rng.randint(2, 9), rng.randint(2, max(2, max_operand // 5))
            question = f"{name} has {a} bags of {b} {item}. How many {item} is that?"
            equation, answer = f"{a}*{b}", a * b
        elif kind == "two_step":
            a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
            c = rng.randint(1, a + b - 1)
            question = f"{name} has {a} {item}, gets {b} more and gives {c} away. How many {item} are left?"
            equation, answer = f"{a}+{b}-{c}", a + b - c
        else:  # "sum" (the name and item, drawn for every kind, go unused)
            a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
            question, equation, answer = f"What is {a} + {b}?", f"{a}+{b}", a + b
        problems.append(Problem(question, equation, answer, kind))
    return problems


def task_splits(
    n_train: int, n_validation: int, seed: int = 0, validation_seed: int | None = None, **generator_kwargs
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and validation problems.

    The validation set depends only on `validation_seed` (default: `seed`) and `n_validation`: distinct questions,
    drawn with a seed of their own. The train set is the generator's stream for `seed` minus validation questions, so
    a longer train split extends a shorter one.
    """
    validation_seed = seed if validation_seed is None else validation_seed
    drawn = generate_problems(4 * n_validation, seed=validation_seed + 7919, **generator_kwargs)
    validation = list({p.question: p for p in drawn}.values())[:n_validation]
    if len(validation) < n_validation:
        raise ValueError(
            f"Cannot draw {n_validation} distinct validation problems with {generator_kwargs or 'defaults'}"
        )
    held_out = {p.question for p in validation}
    train, draw = [], 0
    while len(train) < n_train:
        chunk = generate_problems(max(2 * n_train, 64), seed=seed + 104729 * draw, **generator_kwargs)
        train += [p for p in chunk if p.question not in held_out][: n_train - len(train)]
        draw += 1
    return train, validation


def to_dataset(problems: list[Problem]):
    """A `datasets.Dataset` with the columns `GRPOTrainer` and the task rewards use (`prompt`, `answer`), plus
    `solution` and `kind`."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "prompt": [p.prompt for p in problems],
            "answer": [str(p.answer) for p in problems],
            "solution": [p.solution for p in problems],
            "kind": [p.kind for p in problems],
        }
    )
