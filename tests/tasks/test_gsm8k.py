"""The GSM8K loader, on local files in GSM8K's own formats (no network)."""

from __future__ import annotations

import json

import datasets
import pytest

from adaptive_kl.tasks import gsm8k
from adaptive_kl.tasks.answers import extract_answer
from adaptive_kl.tasks.gsm8k import gsm8k_final_answer, load_gsm8k
from adaptive_kl.tasks.problems import format_prompt
from adaptive_kl.tasks.rewards import accuracy_reward, format_reward


# Rows in GSM8K's format: multi-line reasoning with `<<...>>` calculator annotations, then `#### <answer>`.
ROWS = [
    {
        "question": "Mia baked 48 cookies and gave half of them away. She then baked 48 more. How many does she have?",
        "answer": "Mia gave away 48/2 = <<48/2=24>>24 cookies.\n"
        "She kept 48-24 = <<48-24=24>>24 cookies.\n"
        "Then she has 24+48 = <<24+48=72>>72 cookies.\n"
        "#### 72",
    },
    {
        "question": "A lamp costs $12 and a desk costs 100 times as much. How much do both cost?",
        "answer": "The desk costs 12*100 = $<<12*100=1200>>1200.\n"
        "Both cost 1200+12 = $<<1200+12=1212>>1,212.\n"
        "#### 1,212",
    },
    {
        "question": "The temperature was 3 degrees and fell by 8 degrees. What is it now?",
        "answer": "It is 3-8 = <<3-8=-5>>-5 degrees.\n#### -5",
    },
]
GOLD = ["72", "1212", "-5"]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _check(dataset, rows=ROWS, gold=GOLD):
    assert isinstance(dataset, datasets.Dataset)
    assert dataset.column_names == ["prompt", "answer", "solution", "question"]
    assert dataset["answer"] == gold
    assert dataset["question"] == [row["question"] for row in rows]
    assert dataset["solution"] == [row["answer"] for row in rows]
    assert dataset["prompt"] == [format_prompt(row["question"]) for row in rows]


@pytest.mark.parametrize(
    "solution, expected",
    [
        (ROWS[0]["answer"], "72"),
        (ROWS[1]["answer"], "1212"),
        (ROWS[2]["answer"], "-5"),
        ("#### 18", "18"),
        ("a\n#### 1\n#### 2 ", "2"),
        ("x\n####   3.50\n", "3.5"),
    ],
)
def test_gsm8k_final_answer(solution, expected):
    assert gsm8k_final_answer(solution) == expected


@pytest.mark.parametrize(
    "solution, message",
    [("She has 72.", "no '####'"), ("#### ", "not a single number"), ("#### 72 cookies", "not a single number")],
)
def test_gsm8k_final_answer_rejects(solution, message):
    with pytest.raises(ValueError, match=message):
        gsm8k_final_answer(solution)


def test_load_jsonl_file(tmp_path):
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", ROWS)
    dataset = load_gsm8k(path=str(path))
    _check(dataset)
    # The gold solutions are in the format the rewards expect, and earn the full task reward.
    assert [extract_answer(s) for s in dataset["solution"]] == GOLD
    kwargs = {"prompts": dataset["prompt"], "completions": dataset["solution"], "answer": dataset["answer"]}
    assert format_reward(**kwargs) == accuracy_reward(**kwargs) == [1.0, 1.0, 1.0]

    _check(load_gsm8k(path=str(path), limit=2), ROWS[:2], GOLD[:2])
    assert load_gsm8k(path=str(path), limit=0).column_names == ["prompt", "answer", "solution", "question"]
    with pytest.raises(ValueError, match="limit"):
        load_gsm8k(path=str(path), limit=-1)


def test_load_json_array_file(tmp_path):
    path = tmp_path / "gsm8k.json"
    path.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    _check(load_gsm8k(path=str(path)))


def test_load_directory_by_split(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", ROWS[:1])
    _write_jsonl(tmp_path / "test.jsonl", ROWS)
    _check(load_gsm8k(split="test", path=str(tmp_path)))
    _check(load_gsm8k(split="train", path=str(tmp_path)), ROWS[:1], GOLD[:1])
    with pytest.raises(FileNotFoundError, match="validation"):
        load_gsm8k(split="validation", path=str(tmp_path))


def test_load_hub_snapshot_parquet_layout(tmp_path):
    (tmp_path / "main").mkdir()
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "main" / "test-00000-of-00001.parquet"))
    _check(load_gsm8k(split="test", path=str(tmp_path)))


def test_missing_path_raises_file_not_found(tmp_path):
    missing = tmp_path / "nope" / "gsm8k.jsonl"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_gsm8k(path=str(missing))
    with pytest.raises(FileNotFoundError, match="nope"):
        load_gsm8k(path=str(tmp_path / "nope"))


def test_row_without_final_answer_raises(tmp_path):
    rows = [ROWS[0], {"question": "How many?", "answer": "There are 3+4 = <<3+4=7>>7."}]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=r"row 1.*####"):
        load_gsm8k(path=str(path))
    path = _write_jsonl(tmp_path / "no_question.jsonl", [{"answer": "#### 1"}])
    with pytest.raises(ValueError, match="question"):
        load_gsm8k(path=str(path))


def test_hub_id_goes_through_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(gsm8k.datasets, "load_dataset", fake_load_dataset)
    _check(load_gsm8k(split="test", limit=2), ROWS[:2], GOLD[:2])
    assert calls == [("openai/gsm8k", "main", "test")]
