"""The embedded reference policy: shipped, small, loadable offline, and as accurate as its card says."""

from __future__ import annotations

import json
import os

from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive_kl.demo.embedded import EMBEDDED_TASK, embedded_datasets, embedded_policy_path
from adaptive_kl.tasks import evaluate_accuracy


def test_policy_is_shipped_and_small():
    path = embedded_policy_path()
    size = sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))
    assert size < 4 * 2**20
    assert {"config.json", "model.safetensors", "tokenizer.json", "reference_policy.json"} <= set(os.listdir(path))


def test_recorded_accuracy_is_reproduced_and_leaves_room_to_improve():
    path = embedded_policy_path()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    _, validation = embedded_datasets(n_train=1)
    scores = evaluate_accuracy(
        model, tokenizer, validation["prompt"], validation["answer"], EMBEDDED_TASK["max_new_tokens"]
    )
    # What scripts/build_reference_policy.py recorded about the shipped policy (accuracy, settings, versions).
    with open(os.path.join(path, "reference_policy.json")) as f:
        card = json.load(f)
    assert card["n_validation"] == len(validation) == EMBEDDED_TASK["n_validation"]
    # Greedy decoding is deterministic; a tie broken differently by another torch/transformers build may flip a few.
    assert abs(scores["accuracy"] - card["validation"]["accuracy"]) <= 0.02
    assert 0.25 <= scores["accuracy"] <= 0.65  # follows the task, with clear room for RL


def test_policy_leaves_the_answer_marker_out_mostly_on_subtractions():
    """The designed room for RL: the policy states `#### answer` on the other kinds, and mostly not on subtractions."""
    path = embedded_policy_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    _, validation = embedded_datasets(n_train=1)
    by_kind = {}
    for kind in ("subtract", "add", "two_step", "multiply"):
        rows = validation.filter(lambda row, kind=kind: row["kind"] == kind)
        by_kind[kind] = evaluate_accuracy(
            model, tokenizer, rows["prompt"], rows["answer"], EMBEDDED_TASK["max_new_tokens"]
        )["format"]
    assert by_kind["subtract"] < 0.5
    assert min(by_kind["add"], by_kind["two_step"], by_kind["multiply"]) >= 0.95


def test_tokenizer_round_trips_task_text():
    tokenizer = AutoTokenizer.from_pretrained(embedded_policy_path())
    text = "Q: Ann has 12 apples and gets 7 more. How many apples does Ann have? A: 12+7=19 #### 19"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
