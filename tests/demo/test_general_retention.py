"""The chat task's general-prompt retention set (`adaptive_kl.tasks.general`) and how reports show it."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import CHAT_TEMPLATE
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive_kl.demo.report import SUMMARY_HEADER, summarize, summary_table
from adaptive_kl.demo.runner import VariantRun, merged_by_step
from adaptive_kl.tasks import general
from adaptive_kl.tasks.general import GENERAL_CHAT_PROMPTS, own_answers_dataset
from adaptive_kl.trainers.generation import generate


@pytest.fixture(scope="module")
def chat_policy(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():  # the saved tiny model answers almost only its end token: make it say something
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model, tokenizer


def test_the_general_prompts_are_not_the_training_task():
    """Held out from the arithmetic task by construction: no digits, no operators, no `####`."""
    assert len(GENERAL_CHAT_PROMPTS) == len(set(GENERAL_CHAT_PROMPTS)) >= 20
    assert not any(c in prompt for prompt in GENERAL_CHAT_PROMPTS for c in "0123456789+=#")


def test_the_set_is_the_starting_policy_own_greedy_answers(chat_policy):
    model, tokenizer = chat_policy
    conversations = general.general_chat_prompts()
    dataset = own_answers_dataset(model, tokenizer, conversations, max_new_tokens=12)
    answers = generate(model, tokenizer, conversations, max_new_tokens=12)
    kept = [i for i, answer in enumerate(answers) if tokenizer(answer, add_special_tokens=False)["input_ids"]]
    assert len(kept) >= len(answers) // 2  # the perturbed model answers most prompts
    assert dataset["completion"] == [answers[i] for i in kept]
    # Rendered as GRPOTrainer renders a conversational prompt for generation: the template with the assistant's turn.
    assert dataset["prompt"] == [
        f"user: {GENERAL_CHAT_PROMPTS[i]}\nassistant: " for i in kept
    ]  # fmt: skip


def test_the_first_n_prompts(chat_policy):
    model, tokenizer = chat_policy
    assert [c[0]["content"] for c in general.general_chat_prompts(3)] == list(GENERAL_CHAT_PROMPTS[:3])
    assert len(general.general_chat_prompts()) == len(GENERAL_CHAT_PROMPTS)
    dataset = own_answers_dataset(model, tokenizer, general.general_chat_prompts(3), max_new_tokens=12)
    every = own_answers_dataset(model, tokenizer, general.general_chat_prompts(), max_new_tokens=12)
    assert dataset["completion"] == every["completion"][: len(dataset)]
    assert len(dataset) <= 3


def test_empty_answers_are_left_out_and_no_answer_at_all_gives_no_set(chat_policy, monkeypatch):
    model, tokenizer = chat_policy
    n = len(GENERAL_CHAT_PROMPTS)
    answers = ["ab" if i % 3 == 0 else "" for i in range(n)]
    monkeypatch.setattr("adaptive_kl.trainers.generation.generate", lambda *a, **k: answers)
    dataset = own_answers_dataset(model, tokenizer, general.general_chat_prompts(), max_new_tokens=4)
    assert dataset["completion"] == ["ab"] * len(range(0, n, 3))
    assert dataset["prompt"][1] == f"user: {GENERAL_CHAT_PROMPTS[3]}\nassistant: "
    monkeypatch.setattr("adaptive_kl.trainers.generation.generate", lambda *a, **k: [""] * n)
    assert own_answers_dataset(model, tokenizer, general.general_chat_prompts(), max_new_tokens=4) is None


def test_retention_histories_merge_by_step():
    task = [{"step": 0, "retention/loglik": -1.0}, {"step": 5, "retention/loglik": -0.5}]
    chat = [
        {"step": 0, "general/loglik": -2.0},
        {"step": 5, "general/loglik": -2.5},
        {"step": 7, "general/loglik": -3.0},
    ]
    assert merged_by_step(task, chat) == [
        {"step": 0, "retention/loglik": -1.0, "general/loglik": -2.0},
        {"step": 5, "retention/loglik": -0.5, "general/loglik": -2.5},
        {"step": 7, "general/loglik": -3.0},
    ]
    assert merged_by_step(task) == task and merged_by_step() == []


def run_with_general(name: str, seed: int, general_loglik: tuple[float, float] | None, kl: float = 0.1) -> VariantRun:
    retention = [{"step": 0, "retention/loglik": -1.0}, {"step": 4, "retention/loglik": -0.8}]
    if general_loglik is not None:
        retention[0].update({"general/loglik": general_loglik[0], "general/kl_to_start": 0.0})
        retention[1].update({"general/loglik": general_loglik[1], "general/kl_to_start": kl})
    history = [{"step": s, "reward": 1.0, "completions/mean_length": 20.0} for s in range(1, 5)]
    evaluations = [{"step": 0, "val_accuracy": 0.1}, {"step": 4, "val_accuracy": 0.2}]
    return VariantRun(f"{name}, seed={seed}", {"beta": 0.0, "seed": seed}, history, evaluations, 1.0, retention)


def test_the_general_columns_appear_only_when_a_run_has_them():
    plain = summary_table([run_with_general("beta=0", 0, None)]).splitlines()
    assert plain[0] == "| " + " | ".join(SUMMARY_HEADER) + " |"

    s = summarize(run_with_general("beta=0", 0, (-1.5, -1.75), kl=0.25))
    assert (s["delta_general_loglik"], s["final_general_kl_to_start"]) == (-0.25, 0.25)
    assert math.isnan(summarize(run_with_general("beta=0", 0, None))["delta_general_loglik"])

    table = summary_table([run_with_general("a", 0, (-1.5, -1.75)), run_with_general("b", 0, None)]).splitlines()
    assert table[0].endswith("| Δ length (last − first quarter) | KL–length corr. (last quarter) "
                             "| Δ general-chat loglik | general-chat KL to start (final) |")  # fmt: skip
    assert table[2].endswith("| -0.2500 | 0.1000 |") and table[3].endswith("| n/a | n/a |")

    # TRL's truncation rate (the last quarter of steps: the last one here) comes before them when logged.
    truncated = run_with_general("a", 0, (-1.5, -1.75))
    truncated.history[-1]["completions/clipped_ratio"] = 0.75
    table = summary_table([truncated]).splitlines()
    assert table[0].endswith("| truncated (last quarter) | Δ general-chat loglik | general-chat KL to start (final) |")
    assert table[2].endswith("| 0.75 | -0.2500 | 0.1000 |")


def test_the_general_columns_have_intervals_and_paired_differences_over_seeds():
    runs = [run_with_general("beta=0", s, (-1.0, -1.0 - 0.1 * (s + 1)), kl=0.2) for s in range(3)]
    runs += [run_with_general("beta=0.2", s, (-1.0, -1.0 - 0.05 * (s + 1)), kl=0.1) for s in range(3)]
    lines = summary_table(runs).splitlines()
    header = next(line for line in lines if line.startswith("| variant | seeds"))
    assert header.endswith("| Δ general-chat loglik | general-chat KL to start (final) |")
    means = [line for line in lines if line.startswith("| beta=")]
    # beta=0: Δ = -0.1, -0.2, -0.3 → mean -0.2, half-width t(0.975, 2) × 0.1 / √3 = 0.2484
    assert means[0].endswith("| -0.2000 ± 0.2484 | 0.2000 ± 0.0000 |")
    # paired beta=0.2 − beta=0: +0.05, +0.1, +0.15 → +0.1 ± 0.1242; the KL −0.1 on every seed
    assert means[2].endswith("| +0.1000 ± 0.1242 | -0.1000 ± 0.0000 |")
