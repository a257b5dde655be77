"""What a run trains on, shared by the training command (`adaptive_kl.cli`) and the demo (`adaptive_kl.demo`): the
math tasks and the policies a command line names.

| module | what |
|---|---|
| `problems` | the embedded arithmetic task: a seeded problem generator, splits and datasets |
| `chat` | the same task for a chat model (SmolLM2) |
| `gsm8k` | GSM8K as a dataset of the task (hub id or local file) |
| `general` | the chat task's general-prompt retention set |
| `answers` | final-answer extraction in GSM8K's `####` convention |
| `rewards` | the task's reward functions (`format_reward`, `accuracy_reward`; the quick run's graded one) |
| `evaluation` | validation accuracy by greedy decoding |
| `policies` | named policies (`smollm2`): what `--model` accepts besides a hub id or a local path |

Above the trainers (evaluation generates with them), below both commands. Names are imported on first use, so that
resolving a named policy on the command line loads neither torch nor `datasets`.
"""

from .._exports import lazy_exports


# Public name → module that defines it.
_EXPORTS = {
    "answers_match": "answers",
    "extract_answer": "answers",
    "has_answer_format": "answers",
    "evaluate_accuracy": "evaluation",
    "score_completions": "evaluation",
    "load_gsm8k": "gsm8k",
    "Problem": "problems",
    "generate_problems": "problems",
    "task_splits": "problems",
    "to_dataset": "problems",
    "TASK_REWARDS": "rewards",
    "accuracy_reward": "rewards",
    "format_reward": "rewards",
    "working_similarity_reward": "rewards",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
