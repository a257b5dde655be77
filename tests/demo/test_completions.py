"""What a run wrote, kept beside its numbers: each evaluation's greedy answer and one sampled at temperature 1 for the
first validation problems (`ValidationCallback.samples`, `VariantRun.samples`, `completions.md`), sampled without
moving the training's random state, so that a run that keeps them trains exactly as one that does not."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive_kl.demo.embedded import embedded_datasets, embedded_policy_path
from adaptive_kl.demo.report import write_completions
from adaptive_kl.demo.runner import ValidationCallback, VariantRun
from adaptive_kl.trainers.generation import generate


@pytest.fixture(scope="module")
def policy():
    path = embedded_policy_path()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


PROMPTS = ["Q: 3 + 4 = ?\nA:", "Q: 12 - 5 = ?\nA:", "Q: 6 + 9 = ?\nA:"]


def test_sampling_leaves_the_training_random_state_alone(policy):
    model, tokenizer = policy
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    generate(model, tokenizer, PROMPTS, max_new_tokens=12, seed=7)
    assert torch.equal(torch.rand(4), expected)


def test_sampling_is_seeded_and_samples(policy):
    model, tokenizer = policy
    first = generate(model, tokenizer, PROMPTS, max_new_tokens=12, seed=7)
    assert generate(model, tokenizer, PROMPTS, max_new_tokens=12, seed=7) == first
    draws = [generate(model, tokenizer, PROMPTS, max_new_tokens=12, seed=s) for s in range(8)]
    greedy = generate(model, tokenizer, PROMPTS, max_new_tokens=12)
    assert any(draw != greedy for draw in draws)  # temperature 1: not the greedy answers every time


def test_each_evaluation_keeps_the_first_problems_answers(policy):
    model, tokenizer = policy
    _, validation = embedded_datasets(4, n_validation=6)
    callback = ValidationCallback(tokenizer, validation, eval_every=1, max_new_tokens=12, n_samples=2, sample_seed=3)
    callback._evaluate(0, model)
    callback._evaluate(0, model)  # the same step again: nothing added
    callback._evaluate(5, model)
    assert [s["step"] for s in callback.samples] == [0, 0, 5, 5]
    greedy = generate(model, tokenizer, validation["prompt"][:2], max_new_tokens=12)
    assert [s["greedy"] for s in callback.samples[:2]] == greedy
    assert [s["prompt"] for s in callback.samples[:2]] == validation["prompt"][:2]
    assert [s["answer"] for s in callback.samples[:2]] == validation["answer"][:2]
    sampled = generate(model, tokenizer, validation["prompt"][:2], max_new_tokens=12, seed=3 * 100_003 + 5)
    assert [s["sampled"] for s in callback.samples[2:]] == sampled
    assert [e["step"] for e in callback.evaluations] == [0, 5]


def test_completions_md_holds_every_sample(tmp_path):
    sample = {"step": 25, "prompt": "What is 2 + 3?", "answer": "5", "greedy": "2 + 3 = 5 #### 5", "sampled": "five"}
    run = VariantRun("clip", {}, [], [], 1.0, samples=[sample])
    path = write_completions([run, VariantRun("none", {}, [], [], 1.0)], str(tmp_path / "completions.md"))
    text = open(path).read()
    assert "## clip: step 25" in text and "> What is 2 + 3?" in text and "(answer 5)" in text
    assert "greedy:\n\n```text\n2 + 3 = 5 #### 5\n```" in text and "sampled:\n\n```text\nfive\n```" in text
    assert "## none" not in text
    assert write_completions([VariantRun("none", {}, [], [], 1.0)], str(tmp_path / "empty.md")) is None
    assert not (tmp_path / "empty.md").exists()
