"""The embedded task: answer extraction (GSM8K convention), its reward functions and the problem generator."""

from __future__ import annotations

import pytest
from trl.trainer.utils import get_callable_name

from adaptive_kl.tasks.answers import (
    answers_match,
    completion_text,
    extract_answer,
    final_number,
    has_answer_format,
    normalize_number,
)
from adaptive_kl.tasks.problems import KINDS, format_prompt, generate_problems
from adaptive_kl.tasks.rewards import TASK_REWARDS, accuracy_reward, format_reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("19", "19"),
        ("  19\n", "19"),
        ("0", "0"),
        ("007", "7"),
        ("-5", "-5"),
        ("\u22125", "-5"),  # unicode minus
        ("+5", "5"),
        ("-0", "0"),
        ("1,234", "1234"),
        ("12,345,678", "12345678"),
        ("$3.50", "3.5"),
        ("-$3.50", "-3.5"),
        ("$1,234.00", "1234"),
        ("3.50", "3.5"),
        ("4.0", "4"),
        ("0.0", "0"),
        (".5", "0.5"),
        ("-.50", "-0.5"),
        ("72.", "72"),  # end of sentence
        ("$3.50.", "3.5"),
        ("100", "100"),  # trailing zeros of an integer stay (no exponent form)
        ("123456789012345678901234567890.10", "123456789012345678901234567890.1"),  # exact beyond float precision
        # Rejects: not a single number.
        ("", None),
        ("   ", None),
        ("12a", None),
        ("a12", None),
        ("1.2.3", None),
        ("--3", None),
        ("+-3", None),
        ("5..", None),
        (".", None),
        ("-", None),
        ("$", None),
        ("1,23", None),  # malformed thousands group
        ("1e3", None),
        ("1 2", None),
        ("12+7", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # `####` variants.
        ("12+7=19 #### 19", "19"),
        ("#### 1,234", "1234"),
        ("####-5", "-5"),
        ("#### \u22125", "-5"),
        ("#### $3.50.", "3.5"),
        ("#### 72 apples", "72"),
        ("The answer is\n#### 72", "72"),
        ("#### The answer is 72.", "72"),  # first number after the marker
        ("#### 12-5=7", "12"),  # `-5` there is a subtraction, not a negative number
        ("#### 3, then 4", "3"),
        ("#### 1 #### 2", "2"),  # the last marker counts
        ("#### 2\n#### 1", "1"),
        ("#### 1 ####", None),  # the last marker has nothing after it
        ("####", None),
        ("#### ", None),
        ("#### apples", None),
        ("#### 1e3", None),
        ("#### 1.2.3", None),
        # `</think>`: only the text after the last one counts.
        ("<think>So it is 42.</think>", None),
        ("<think>#### 42</think>", None),
        ("<think>#### 42</think> #### 7", "7"),
        ("<think>a</think> #### 3 <think>b</think> #### 5", "5"),
        ("<think>12+7=19 #### 19</think>19", None),
        # `<answer>` blocks.
        ("<answer>19</answer>", "19"),
        ("<answer> 19 </answer>", "19"),
        ("<answer>\n$1,234.50\n</answer>", "1234.5"),
        ("<answer>The total is 12+7=19 apples</answer>", "19"),  # last number inside
        ("<answer>x = -3</answer>", "-3"),
        ("<answer>no idea</answer>", None),
        ("<answer></answer>", None),
        ("<answer>3</answer> then <answer>5</answer>", "5"),
        ("<answer><answer>5</answer></answer>", "5"),  # nested
        ("<answer>3 <answer>5</answer>", "5"),  # an earlier unclosed block does not swallow the closed one
        ("<answer>5</answer> <answer>7", "5"),  # a trailing unclosed block is ignored
        ("<answer>7", None),  # unclosed, no other marker
        ("<answer>7 #### 8", "8"),  # unclosed block falls back to `####`
        ("7</answer>", None),
        ("#### 4 <answer>9</answer>", "9"),  # the block takes priority over `####`
        ("<think><answer>1</answer></think><answer>2</answer>", "2"),
        # No marker: no answer, even when a number is present.
        ("", None),
        ("19", None),
        ("12+7=19", None),
        ("The answer is 19.", None),
        ("#", None),
        ("## 19", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected
    assert has_answer_format(text) is (expected is not None)


def test_extract_answer_never_raises_on_garbage():
    for text in ["<answer>", "</answer>", "</think>", "<think>", "####" * 5, "$$$", "-.-", "\x00####\x00", "<<>>####"]:
        assert extract_answer(text) is None
    assert extract_answer("#### " + "9" * 999) == "9" * 999  # exact, no float overflow
    assert extract_answer(None) is None


@pytest.mark.parametrize(
    "text, strict, lenient",
    [
        # The `####` line's concluding number: an equation's result, else the line's first number.
        ("#### 4 + 13 = 17", "4", "17"),
        ("4 + 13 = 17\n#### 4 + 13 = 17\nThe answer is 17.", "4", "17"),
        ("#### 17 apples (4 + 13)", "17", "17"),
        ("#### 17", "17", "17"),
        ("#### $1,234.50.", "1234.5", "1234.5"),
        ("#### 4 + 13", "4", "4"),  # no `=`: nothing is concluded beyond the first number
        ("#### x = -3", "-3", "-3"),
        ("####\n\n17", "17", "17"),  # the first line with text after the marker
        ("#### 19\n20 = 20", "19", "19"),  # only that line
        ("#### 4 + 13 = seventeen", "4", "4"),  # no number after `=`: the line's first
        # No number after the marker, or no marker: the last number anywhere.
        ("12 + 7 = 19 ####", None, "19"),
        ("so 7 + 12 = 19.", None, "19"),
        ("<answer>12 + 7 = 19</answer> #### 5", "19", "19"),  # a block keeps its priority
        ("<answer>none</answer> 19", None, "19"),
        ("<think>#### 2 = 3</think> 4 + 13 = 17", None, "17"),
        ("no number", None, None),
    ],
)
def test_final_number_reads_the_number_the_marker_line_concludes_with(text, strict, lenient):
    """The format-free accuracy's reading (`final_number`) beside the rewards' strict one (`extract_answer`)."""
    assert extract_answer(text) == strict
    assert final_number(text) == lenient


@pytest.mark.parametrize(
    "predicted, gold, expected",
    [
        ("19", 19, True),
        ("19", "19", True),
        ("1234", "1,234", True),
        ("1,234", 1234, True),
        ("$3.50", 3.5, True),
        ("4", 4.0, True),
        ("-5", "\u22125", True),
        ("100000000000000000000", 1e20, True),
        ("19", 20, False),
        ("19", "19.5", False),
        ("-19", 19, False),
        (None, 19, False),
        (None, "", False),
        ("abc", "abc", False),  # not numbers: never a match
        ("1", True, False),
        ("0", float("nan"), False),
    ],
)
def test_answers_match(predicted, gold, expected):
    assert answers_match(predicted, gold) is expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("#### 5", "#### 5"),
        ([{"role": "assistant", "content": "#### 5"}], "#### 5"),
        (
            [
                {"role": "assistant", "content": "#### 1"},
                {"role": "tool", "content": "2"},
                {"role": "assistant", "content": "#### 3"},
            ],
            "#### 3",
        ),
        ([{"role": "assistant", "content": "#### 3"}, {"role": "tool", "content": "2"}], "#### 3"),
        (
            [{"role": "assistant", "content": [{"type": "text", "text": "1"}, {"type": "image"}, {"text": "2"}]}],
            "1\n2",  # parts joined on newlines: `1` and `2` do not fuse into `12`
        ),
        ([{"role": "assistant", "content": None}], ""),
        ([{"role": "user", "content": "#### 5"}], ""),
        ([], ""),
    ],
)
def test_completion_text(completion, expected):
    assert completion_text(completion) == expected


def _trl_call(func, completions, answer):
    """Call a reward function the way `GRPOTrainer._calculate_rewards` does: keyword arguments, columns as lists."""
    n = len(completions)
    return func(
        prompts=["Q: ? A: "] * n,
        completions=completions,
        completion_ids=[[1, 2, 3]] * n,
        trainer_state=None,
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
        answer=answer,
        question=["?"] * n,
    )


COMPLETIONS = [
    "12+7=19 #### 19",  # formatted, right
    "12+7=20 #### 20",  # formatted, wrong
    "12+7=19",  # right number, no format
    "<think>#### 19</think> so 19",  # the only marker is inside the think block
    "<answer>19</answer>",  # formatted, right
    "",
]
GOLD = ["19", 19, "19", "19", "19.0", "19"]


@pytest.mark.parametrize("conversational", [False, True])
def test_rewards_called_as_trl_calls_them(conversational):
    completions = [[{"role": "assistant", "content": c}] if conversational else c for c in COMPLETIONS]
    formats = _trl_call(format_reward, completions, GOLD)
    accuracies = _trl_call(accuracy_reward, completions, GOLD)
    for rewards in (formats, accuracies):
        assert len(rewards) == len(COMPLETIONS) and all(type(r) is float for r in rewards)
    assert formats == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert accuracies == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    # Formatted but wrong: the two rewards disagree, and the task reward (their sum) is 1.
    assert formats[1] + accuracies[1] == 1.0


def test_task_rewards_and_their_log_names():
    assert TASK_REWARDS == (format_reward, accuracy_reward)
    # TRL logs `rewards/<name>/mean` with this name.
    assert [get_callable_name(f) for f in TASK_REWARDS] == ["format_reward", "accuracy_reward"]


def test_accuracy_reward_needs_one_gold_per_completion():
    with pytest.raises(ValueError):
        accuracy_reward(completions=["#### 1", "#### 2"], answer=["1"])


def test_generator_is_deterministic():
    first = generate_problems(50, seed=3)
    assert len(first) == 50
    assert first == generate_problems(50, seed=3)
    assert first != generate_problems(50, seed=4)


def test_every_solution_extracts_to_its_answer_and_earns_two():
    problems = generate_problems(200, seed=0)
    assert {op for p in problems for op in "+-*" if op in p.equation} == {"+", "-", "*"}  # all kinds drawn
    for problem in problems:
        assert problem.prompt == format_prompt(problem.question)
        assert extract_answer(problem.solution) == str(problem.answer)
    answers = [p.answer for p in problems]
    solutions = [p.solution for p in problems]
    formats, accuracies = (_trl_call(f, solutions, answers) for f in TASK_REWARDS)
    assert [f + a for f, a in zip(formats, accuracies)] == [2.0] * len(problems)


@pytest.mark.parametrize("kind", ["subtract", "two_step"])
@pytest.mark.parametrize("max_operand", [2, 50])
def test_subtraction_answers_are_never_negative(kind, max_operand):
    problems = generate_problems(300, seed=1, max_operand=max_operand, kinds=(kind,))
    assert all("-" in p.equation for p in problems)
    assert min(p.answer for p in problems) >= 0


def test_generator_rejects_invalid_arguments():
    with pytest.raises(ValueError, match="kinds"):
        generate_problems(1, kinds=("add", "divide"))
    with pytest.raises(ValueError, match="max_operand"):
        generate_problems(1, max_operand=1)
    assert set(KINDS) == {"add", "subtract", "multiply", "two_step", "sum"}
    # The embedded task draws word problems only: its stream is the one the embedded policy was measured on.
    assert {p.kind for p in generate_problems(200)} == {"add", "subtract", "multiply", "two_step"}


# --- train/validation splits -----------------------------------------------------------------------------------------


def test_task_splits_are_disjoint_and_stable():
    from adaptive_kl.tasks.problems import task_splits

    train, validation = task_splits(3000, 200, seed=0)
    assert len(validation) == len({p.question for p in validation}) == 200
    assert not {p.question for p in train} & {p.question for p in validation}
    longer, same_validation = task_splits(6000, 200, seed=0)
    assert longer[:3000] == train and same_validation == validation  # a longer train split extends a shorter one
    other_train, other_validation = task_splits(3000, 200, seed=1)
    assert other_validation != validation and other_train[:50] != train[:50]
    _, fixed_validation = task_splits(3000, 200, seed=1, validation_seed=0)
    assert fixed_validation == validation


def test_embedded_validation_never_moves_with_the_seed_nor_meets_training_problems():
    from adaptive_kl.demo.embedded import embedded_datasets
    from adaptive_kl.tasks.problems import task_splits

    _, validation = embedded_datasets(10)
    for seed in (1, 2):
        train, other = embedded_datasets(500, seed=seed)
        assert other["prompt"] == validation["prompt"]
        assert not set(train["prompt"]) & set(validation["prompt"])
    fine_tuning, _ = task_splits(20000, 200, seed=0)  # a prefix of the reference policy's fine-tuning data
    assert not {p.prompt for p in fine_tuning} & set(validation["prompt"])
