"""Checks of what users hand the trainers: their data and what their reward functions return.

TRL trusts both, so a bad value surfaces deep inside training as a message about something else: an empty prompt
as an `IndexError` from `generate`, a reward function returning strings as `too many dimensions 'str'` from
`torch.tensor`. These checks name the culprit instead: `check_train_dataset` (every prompt of a map-style dataset,
before any model is loaded), `check_drawn_prompts` (a streaming dataset's rows as training draws them) and
`checked_reward_func` (a reward function's output, on every call, before TRL converts it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from numbers import Real

import torch


def _is_empty_prompt(prompt) -> bool:
    """A prompt that gives the model nothing to continue: missing, an empty string, or no messages."""
    return prompt is None or (isinstance(prompt, str | list | tuple) and len(prompt) == 0)


def _empty_prompt_rows(dataset) -> list[int]:
    """Rows of a `datasets.Dataset` whose prompt is null, `""` or `[]`: computed in Arrow (milliseconds for millions
    of rows), on the dataset's own rows (after `select`, `shuffle`, `filter`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.with_format("arrow")["prompt"]
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        lengths = pc.utf8_length(column)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = pc.list_value_length(column)
    else:  # another type (e.g. all null): row by row
        return [i for i, prompt in enumerate(column.to_pylist()) if _is_empty_prompt(prompt)]
    return pc.indices_nonzero(pc.fill_null(pc.equal(lengths, 0), True)).to_pylist()


def _empty_prompts_error(name: str, empty: list[int], where: str = "rows") -> ValueError:
    shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
    return ValueError(
        f"{name} has {len(empty)} empty prompt(s) ({where} {shown}): a prompt must be a non-empty string or a "
        "non-empty list of chat messages. Drop those rows, e.g. dataset.filter(lambda row: row['prompt'])."
    )


def check_train_dataset(dataset, name: str = "train_dataset", environment: bool = False) -> None:
    """Raises `ValueError` for a map-style dataset without a `"prompt"` column or with an empty prompt.

    Only a `datasets.Dataset` or a list of dicts is checked ahead: an `IterableDataset` is read only by training
    (`check_drawn_prompts`), and a custom dataset may compute its prompts. With an `environment_factory`
    (`environment=True`), whose environment may supply each prompt from `reset()`, TRL accepts a dataset without a
    `"prompt"` column: only the prompts a dataset has are checked.
    """
    from datasets import Dataset

    if isinstance(dataset, Dataset):
        if "prompt" not in dataset.column_names:
            if environment:
                return
            raise ValueError(
                f"{name} has no 'prompt' column (its columns: {dataset.column_names}); GRPO generates completions "
                "for the prompts of that column. Rename your prompt column to 'prompt'."
            )
        empty = _empty_prompt_rows(dataset)
    elif isinstance(dataset, list) and all(isinstance(row, dict) for row in dataset):
        empty = [i for i, row in enumerate(dataset) if "prompt" in row or not environment]
        empty = [i for i in empty if _is_empty_prompt(dataset[i].get("prompt"))]
    else:
        return
    if empty:
        raise _empty_prompts_error(name, empty)


def check_drawn_prompts(rows: list, name: str = "train_dataset") -> None:
    """The same check on the rows of a batch as training draws them: `ValueError` for an empty prompt. Rows without a
    `"prompt"` key are left to the host (an environment supplies their prompts, or TRL reports the missing key)."""
    empty = [
        i
        for i, row in enumerate(rows)
        if isinstance(row, dict) and "prompt" in row and _is_empty_prompt(row["prompt"])
    ]
    if empty:
        raise _empty_prompts_error(name, empty, "in a drawn batch, at positions")


class RewardOutputError(TypeError):
    """A reward function returned something that is not one reward per completion."""


def _is_reward(value) -> bool:
    """Whether TRL can take `value` as one completion's reward: None, a real number (a bool too: True is 1.0), or a
    one-element real tensor or NumPy array."""
    if value is None or isinstance(value, Real):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    if type(value).__module__ == "numpy":
        return getattr(value, "size", 0) == 1 and getattr(getattr(value, "dtype", None), "kind", "") in "biuf"
    return False


def _check_rewards(rewards, name: str, completions):
    """`rewards`, after checking that it is a sequence of rewards (`_is_reward`); else a `TypeError` naming `name`."""
    if isinstance(rewards, str | bytes) or not (hasattr(rewards, "__len__") and hasattr(rewards, "__iter__")):
        num_completions = len(completions) if completions is not None else -1
        raise RewardOutputError(
            f"The reward function {name!r} returned {type(rewards).__name__} {rewards!r:.80}; it must return a list "
            f"with one float (or None) per completion ({num_completions} here)."
        )
    for i, value in enumerate(rewards):
        if not _is_reward(value):
            raise RewardOutputError(
                f"The reward function {name!r} returned {value!r:.80} ({type(value).__name__}) for completion {i}; "
                "rewards must be numbers (float, int, bool) or None where the function does not apply."
            )
    return rewards


def checked_reward_func(func: Callable, name: str) -> Callable:
    """`func`, wrapped so that each call's output is checked (sync or async alike): a bad output raises
    `RewardOutputError` naming the function, the value and the completion. Keeps the name TRL logs under."""
    # TRL's own test (imported here: `hooks` imports this module before TRL is version-checked), so that the wrapper is
    # dispatched as the function itself would be.
    from trl.trainer.utils import is_async_callable

    if is_async_callable(func):

        async def checked(*args, **kwargs):
            return _check_rewards(await func(*args, **kwargs), name, kwargs.get("completions"))

    else:

        def checked(*args, **kwargs):
            return _check_rewards(func(*args, **kwargs), name, kwargs.get("completions"))

    functools.update_wrapper(checked, func)  # attributes `func` lacks (a partial's __name__) are skipped
    checked.__name__ = name
    return checked
