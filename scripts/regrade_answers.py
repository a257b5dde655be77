"""Re-grades the real-model studies' greedy answers with the format-free reader (`tasks.answers.final_number`) as it
was before the `####` line's concluding number counted (the first number after the marker) and as it is now.

    python scripts/regrade_answers.py            # the answers the runs kept (runs.json `samples`)
    python scripts/regrade_answers.py --start    # and SmolLM2's own step-0 answers to all 64 validation problems
    python scripts/regrade_answers.py --start --write    # into docs/studies/real/regrade/summary.md

A run keeps, at each evaluation, the greedy answers to the first 4 validation problems only, and no weights: the
format-free accuracy a summary reports over 64 problems at the end cannot be recomputed, but these answers can. At
step 0 every run of a study starts from the same policy, so `--start` regenerates its answers to all 64 problems
(greedy, SmolLM2-135M-Instruct, the chat task, 64 new tokens) and grades them both ways; the old reading must give
the summaries' 0.266 (17 of 64), which checks the regeneration.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)

from adaptive_kl.tasks.answers import THINK_CLOSE, _numbers, answers_match, extract_answer, final_number  # noqa: E402


def first_number_reading(text: str) -> str | None:
    """The format-free reader before: the strict reading (the first number after the last `####`), else the last
    number anywhere."""
    answer = extract_answer(text)
    if answer is not None or not isinstance(text, str):
        return answer
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def kept_answers() -> list[str]:
    """Per study, at step 0 and at the last evaluation: how many kept greedy answers are right under each reading."""
    counts = defaultdict(lambda: [0, 0, 0, 0])  # (study, when) → answers, right before, right now, readings changed
    for path in sorted(glob.glob(os.path.join(REPOSITORY, "docs", "studies", "real", "*", "runs", "*", "*",
                                              "runs.json"))):  # fmt: skip
        study = os.path.relpath(path, os.path.join(REPOSITORY, "docs", "studies", "real")).split(os.sep)[0]
        with open(path) as f:
            (run,) = json.load(f)
        samples = run.get("samples") or []
        last = max((sample["step"] for sample in samples), default=None)
        for sample in samples:
            when = "step 0" if sample["step"] == 0 else "final" if sample["step"] == last else None
            if when is None:
                continue
            before, now = first_number_reading(sample["greedy"]), final_number(sample["greedy"])
            row = counts[(study, when)]
            row[0] += 1
            row[1] += answers_match(before, sample["answer"])
            row[2] += answers_match(now, sample["answer"])
            row[3] += before != now
    lines = ["| study | evaluation | greedy answers kept | right, first number after #### | right, the line's "
             "concluding number | readings that changed |", "|---|---|---|---|---|---|"]  # fmt: skip
    for (study, when), (n, before, now, changed) in sorted(counts.items()):
        lines.append(f"| {study} | {when} | {n} | {before} ({before / n:.3f}) | {now} ({now / n:.3f}) | {changed} |")
    return lines


def start_answers() -> list[str]:
    """SmolLM2's greedy answers to the chat task's 64 validation problems at step 0, graded both ways."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptive_kl.demo.budgets import SMOLLM2_DEMO
    from adaptive_kl.models import smollm2_path
    from adaptive_kl.tasks.chat import chat_datasets
    from adaptive_kl.trainers.generation import generate

    torch.manual_seed(0)
    path = smollm2_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    _, validation = chat_datasets(1, SMOLLM2_DEMO["n_validation"], seed=0)
    greedy = generate(model.eval(), tokenizer, validation["prompt"], SMOLLM2_DEMO["max_new_tokens"])
    before = sum(
        answers_match(first_number_reading(text), answer) for text, answer in zip(greedy, validation["answer"])
    )
    now = sum(answers_match(final_number(text), answer) for text, answer in zip(greedy, validation["answer"]))
    n = len(greedy)
    return [f"Step 0, all {n} validation problems: right {before} ({before / n:.3f}) with the first number after "
            f"####, {now} ({now / n:.3f}) with the line's concluding number."]  # fmt: skip


SUMMARY = os.path.join("docs", "studies", "real", "regrade", "summary.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", action="store_true", help="also regenerate and grade the step-0 answers")
    parser.add_argument("--write", action="store_true", help=f"write {SUMMARY} (with the machine and command)")
    args = parser.parse_args(argv)
    lines = kept_answers() + (["", *start_answers()] if args.start else [])
    print("\n".join(lines))
    if args.write:
        from adaptive_kl.metrics.environment import environment_lines

        command = "python scripts/regrade_answers.py" + " --start" * args.start + " --write"
        path = os.path.join(REPOSITORY, SUMMARY)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("# The format-free reader, before and after the `####` line's concluding number\n\n")
            f.write(__doc__.split("\n\n", 2)[2].strip() + "\n\n" + "\n".join(environment_lines(command)) + "\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
