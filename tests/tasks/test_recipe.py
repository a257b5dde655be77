"""A user's own task (`tasks.recipe`): which rows are held out, and the held-out reward as `GRPOTrainer` sums it."""

from __future__ import annotations

import math

import datasets
import pytest
from transformers import AutoTokenizer

from adaptive_kl.demo.embedded import embedded_policy_path
from adaptive_kl.tasks.recipe import RecipeError, held_out_reward, train_and_held_out


ROWS = [{"prompt": f"Q: {i} + 1? A: ", "answer": str(i + 1)} for i in range(10)]


def test_without_a_test_split_the_last_rows_are_held_out_and_never_trained_on(tmp_path):
    path = tmp_path / "train.jsonl"
    datasets.Dataset.from_list(ROWS).to_json(str(path))
    train, held_out = train_and_held_out(str(path), "train", "test", 3)
    assert train["prompt"] == [row["prompt"] for row in ROWS[:7]]
    assert held_out["prompt"] == [row["prompt"] for row in ROWS[7:]]
    with pytest.raises(RecipeError, match="holding out 10 would leave none to train on"):
        train_and_held_out(str(path), "train", "test", 10)


def test_a_test_split_gives_its_first_rows_and_training_keeps_every_train_row(tmp_path):
    directory = tmp_path / "splits"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:4][::-1])}
    ).save_to_disk(str(directory))
    train, held_out = train_and_held_out(str(directory), "train", "test", 2)
    assert len(train) == 10 and held_out["answer"] == ["4", "3"]
    with pytest.raises(RecipeError, match="the 'test' split of .* has 4 rows, fewer than 5"):
        train_and_held_out(str(directory), "train", "test", 5)
    with pytest.raises(RecipeError, match="'valid' is not a split of .*its splits: \\['train', 'test'\\]"):
        train_and_held_out(str(directory), "valid", "test", 2)


def test_a_dataset_without_prompts_is_refused_naming_its_columns(tmp_path):
    path = tmp_path / "questions.jsonl"
    datasets.Dataset.from_list([{"question": "a", "answer": "1"}] * 4).to_json(str(path))
    with pytest.raises(RecipeError, match="no 'prompt' column \\(its columns: \\['question', 'answer'\\]\\)"):
        train_and_held_out(str(path), "train", "test", 1)


def test_the_held_out_reward_calls_each_function_as_the_trainer_does_and_sums_them():
    """Text prompts get text completions, conversations a message each; every other column and the completion's
    token ids go to the functions; `None` is left out of the sum, and all `None` is NaN; weights as given."""
    tokenizer = AutoTokenizer.from_pretrained(embedded_policy_path())
    seen = {}

    def length(completions, completion_ids, answer, **kwargs):
        seen.update(completions=completions, answer=answer, kwargs=sorted(kwargs))
        assert completion_ids == tokenizer(["12", "7 ", "x"], add_special_tokens=False)["input_ids"]
        return [float(len(ids)) for ids in completion_ids]

    def only_first(completions, **kwargs):
        return [1.0, None, None]

    def never(completions, **kwargs):
        return [None] * len(completions)

    rows = [{"prompt": "Q: a", "answer": "12"}, {"prompt": "Q: b", "answer": "7"}, {"prompt": "Q: c", "answer": "0"}]
    totals = held_out_reward([length, only_first, never], tokenizer, rows, ["12", "7 ", "x"])
    expected_lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in ("12", "7 ", "x")]
    assert totals == [expected_lengths[0] + 1.0, float(expected_lengths[1]), float(expected_lengths[2])]
    assert seen["completions"] == ["12", "7 ", "x"] and seen["answer"] == ["12", "7", "0"]
    assert seen["kwargs"] == ["log_extra", "log_metric", "prompts", "trainer_state"]
    conversation = [{"prompt": [{"role": "user", "content": "Q: a"}], "answer": "12"}]
    held_out_reward([length], tokenizer, conversation * 3, ["12", "7 ", "x"])
    assert seen["completions"][0] == [{"role": "assistant", "content": "12"}]
    assert math.isnan(held_out_reward([never], tokenizer, rows, ["12", "7 ", "x"])[0])
    weighted = held_out_reward([length, only_first], tokenizer, rows, ["12", "7 ", "x"], weights=[0.5, 3.0])
    assert weighted == [0.5 * expected_lengths[0] + 3.0, 0.5 * expected_lengths[1], 0.5 * expected_lengths[2]]
