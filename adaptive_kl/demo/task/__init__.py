"""The embedded math task: problem generator, answer extraction, rewards, GSM8K loader and accuracy evaluation."""

from .answers import answers_match, extract_answer, has_answer_format
from .evaluation import evaluate_accuracy, score_completions
from .gsm8k import load_gsm8k
from .problems import Problem, generate_problems, task_splits, to_dataset
from .rewards import TASK_REWARDS, accuracy_reward, format_reward


__all__ = [
    "Problem",
    "TASK_REWARDS",
    "accuracy_reward",
    "answers_match",
    "evaluate_accuracy",
    "extract_answer",
    "format_reward",
    "generate_problems",
    "has_answer_format",
    "load_gsm8k",
    "score_completions",
    "task_splits",
    "to_dataset",
]
