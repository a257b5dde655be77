"""A task of the user's own, named as a TRL recipe names it: a dataset (a local file or directory, or a hub id) and
reward functions (this package's, TRL's, or `module.path:function`). `adaptive-kl grpo` (`cli.grpo`) trains on it;
`adaptive-kl compare` and `frontier` (`--dataset`, `--reward-funcs`) hold part of it out, to measure how far a run
drifted and what it earns on prompts it never trained on.

A name that does not resolve raises `RecipeError` (a `ValueError`), which each command reports as its usage error,
naming the option."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import os
import sys

from .rewards import accuracy_reward, format_reward


class RecipeError(ValueError):
    """A dataset or reward function that cannot be loaded, with the reason."""


def closest(name: str, candidates) -> str:
    """` (did you mean 'x'?)` for the candidates closest to `name`, or an empty string (the commands' hint for any
    misspelt name: `usage` takes it from here)."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


# --- reward functions ------------------------------------------------------------------------------------------------


def answer_accuracy_reward(completions, answer, **kwargs) -> list[float]:
    """This package's task accuracy (1.0 when the answer after `####` equals the `answer` column): the name keeps TRL's
    `accuracy_reward` for TRL's math-verify reward."""
    return accuracy_reward(completions, answer, **kwargs)


def _trl_reward(name: str):
    import trl.rewards

    if name == "get_soft_overlong_punishment":  # TRL's script's settings
        return trl.rewards.get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
    if name in ("accuracy_reward", "reasoning_accuracy_reward") and importlib.util.find_spec("math_verify") is None:
        raise RecipeError(f"{name}: TRL's {name} needs math-verify: pip install math-verify")
    return getattr(trl.rewards, name)


PACKAGE_REWARDS = {"format_reward": format_reward, "answer_accuracy_reward": answer_accuracy_reward}
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")


def resolve_reward_func(spec: str):
    """The reward function `spec` names: a registered name, `module.path:function` or `module.path.function`
    (imported from the working directory too, as TRL's script does); `RecipeError` saying why not."""
    if spec in PACKAGE_REWARDS:
        return PACKAGE_REWARDS[spec]
    if spec in TRL_REWARDS:
        return _trl_reward(spec)
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
    elif "." in spec:
        module_name, _, attribute = spec.rpartition(".")
    else:
        known = [*PACKAGE_REWARDS, *TRL_REWARDS]
        raise RecipeError(
            f"{spec!r} is not a known reward function{closest(spec, known)}; give one of {known}, or "
            "'module.path:function' for your own"
        )
    if not module_name or not attribute:
        raise RecipeError(f"{spec!r}: expected 'module.path:function'")
    if os.getcwd() not in sys.path:  # as TRL's script: modules next to the recipe are importable
        sys.path.insert(0, os.getcwd())
    importlib.invalidate_caches()  # a module written since the last import (a test, a notebook) is found
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RecipeError(f"{spec!r}: cannot import module {module_name!r} ({error})") from None
    if not hasattr(module, attribute):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise RecipeError(f"{spec!r}: module {module_name!r} has no {attribute!r}{closest(attribute, names)}")
    func = getattr(module, attribute)
    if not callable(func):
        raise RecipeError(f"{spec!r}: {module_name}.{attribute} is a {type(func).__name__}, not a function")
    return func


def held_out_reward(
    reward_funcs: list, tokenizer, rows: list[dict], completions: list[str], weights: list[float] | None = None
) -> list[float]:
    """Each completion's total reward, the functions called as `GRPOTrainer` calls them (the prompt, the completion
    as a message when the prompt is a conversation, its token ids, every other column of its row; no trainer state)
    and weighted as it weights them (`reward_weights`; None: 1 each), a function's `None` left out of the sum as TRL
    leaves it; NaN where every function gave `None` (TRL warns there and sums to 0)."""
    conversational = not isinstance(rows[0]["prompt"], str)
    messages = [[{"role": "assistant", "content": text}] for text in completions] if conversational else completions
    columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
    ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    per_func = [
        func(
            prompts=[row["prompt"] for row in rows],
            completions=messages,
            completion_ids=ids,
            trainer_state=None,
            log_extra=lambda *args, **kwargs: None,
            log_metric=lambda *args, **kwargs: None,
            **columns,
        )
        for func in reward_funcs
    ]
    weights = [1.0] * len(reward_funcs) if weights is None else weights
    totals = []
    for values in zip(*per_func, strict=True):
        given = [weight * value for weight, value in zip(weights, values, strict=True) if value is not None]
        totals.append(float(sum(given)) if given else math.nan)
    return totals


# --- datasets --------------------------------------------------------------------------------------------------------


# Local file suffix → `datasets` builder.
DATA_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_local_dataset(path: str, train_split: str):
    """A `DatasetDict` from a local file (its rows are the `train_split` split), a `save_to_disk` directory, or a
    directory of data files named by split."""
    import datasets

    if os.path.isfile(path):
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in DATA_FILE_BUILDERS:
            raise RecipeError(f"{path}: unsupported file type {suffix!r}; use one of {list(DATA_FILE_BUILDERS)}")
        return datasets.load_dataset(DATA_FILE_BUILDERS[suffix], data_files={train_split: path})
    if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json")):
        loaded = datasets.load_from_disk(path)
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({train_split: loaded})
    return datasets.load_dataset(path)


def load_dataset_dict(name: str, train_split: str = "train", config: str | None = None, streaming: bool = False):
    """The `DatasetDict` `name` names: a local file (its rows are `train_split`), a local directory, or a hub id."""
    local = os.path.expanduser(name)
    try:
        if os.path.exists(local):
            return _load_local_dataset(local, train_split)
        import datasets

        return datasets.load_dataset(name, name=config, streaming=streaming)
    except RecipeError:
        raise
    except Exception as error:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ValueError)
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RecipeError(f"{name}: cannot load it ({first_line})") from None


def split_of(dataset_dict, split: str, name: str):
    """The split `split` of `dataset_dict` (loaded from `name`), or `RecipeError` listing its splits."""
    if split not in dataset_dict:
        raise RecipeError(f"{split!r} is not a split of {name} (its splits: {list(dataset_dict)})")
    return dataset_dict[split]


def train_and_held_out(name: str, train_split: str, test_split: str, n_held_out: int):
    """`(train, held_out)` of the dataset `name`: the held-out rows are the first `n_held_out` of `test_split` when the
    dataset has that split, else the last `n_held_out` of `train_split`, which `train` then leaves out; `RecipeError`
    when there are too few rows or no `prompt` column."""
    data = load_dataset_dict(name, train_split)
    train = split_of(data, train_split, name)
    if "prompt" not in train.column_names:
        raise RecipeError(f"{name}: no 'prompt' column (its columns: {train.column_names}); TRL trains on prompts")
    if test_split in data:
        held_out = data[test_split]
        if len(held_out) < n_held_out:
            raise RecipeError(f"the {test_split!r} split of {name} has {len(held_out)} rows, fewer than {n_held_out}")
        return train, held_out.select(range(n_held_out))
    if len(train) <= n_held_out:
        raise RecipeError(
            f"{name} has no {test_split!r} split and its {train_split!r} split has {len(train)} rows: holding out "
            f"{n_held_out} would leave none to train on"
        )
    kept = len(train) - n_held_out
    return train.select(range(kept)), train.select(range(kept, len(train)))
