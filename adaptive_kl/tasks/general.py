"""General chat retention: does RL on arithmetic change how a chat model answers everything else?

The chat task's own retention set (`retention/*`) scores held-out `####` solutions, so on a chat model it rises as
the format is learned: it measures learning, not forgetting. This set measures forgetting. It holds chat prompts
that are not arithmetic (facts, advice, definitions, short writing) with, as completions, the *starting* policy's own
greedy answers to them. Scored by `RetentionCallback(prefix="general", kl_to_start=True)`:

- `general/loglik`: the mean per-token log-likelihood of those answers under the current policy (a fall from step 0
  means the policy has moved away from how it answered before training);
- `general/kl_to_start`: the exact KL(π_θ ‖ π_start) of the next-token distributions on those answers, averaged
  over their tokens: how far the policy drifted on conversations it was never trained on.

The answers are generated once per run from the policy before training (greedy, so every variant and seed of a
comparison on the same model scores the same answers, and paired differences compare like with like).
"""

from __future__ import annotations


# Written for this project; none asks for arithmetic, so none is in the training task's distribution.
GENERAL_CHAT_PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what photosynthesis is in simple words.",
    "Write a short poem about the sea.",
    "What does a librarian do?",
    "How do I make a cup of tea?",
    "Why is the sky blue?",
    "Suggest a name for a friendly cat.",
    "What are the benefits of regular exercise?",
    "Describe a rainy day in two sentences.",
    "What is the difference between a virus and a bacterium?",
    "How can I be more productive when working from home?",
    "Who wrote Romeo and Juliet?",
    "What should I pack for a weekend hiking trip?",
    "Explain what a computer program is to a child.",
    "Write a polite email declining a meeting invitation.",
    "What is the largest planet in our solar system?",
    "Give me a simple recipe for a vegetable soup.",
    "Why do leaves change colour in autumn?",
    "What is a good way to start learning a new language?",
    "Summarize the story of Cinderella.",
    "What are some ways to reduce stress?",
    "How does a rainbow form?",
    "Recommend a hobby for someone who likes being outdoors.",
)


def general_chat_prompts(n: int | None = None) -> list[list[dict]]:
    """The first `n` prompts (all by default) as conversations (one user message each), as the chat task's are."""
    return [[{"role": "user", "content": question}] for question in GENERAL_CHAT_PROMPTS[:n]]


def own_answers_dataset(model, tokenizer, prompts: list, max_new_tokens: int):
    """`datasets.Dataset` with `prompt` (rendered as `GRPOTrainer` renders prompts for generation: a conversation by
    the tokenizer's chat template, with the assistant's generation prompt) and `completion` (`model`'s greedy answer,
    at most `max_new_tokens` tokens) for `prompts`, for `RetentionCallback`; `None` when every answer is empty
    (nothing to score). The demo scores the general chat prompts so, and a user's held-out prompts (`--dataset`).

    Call it on the policy before training: the answers are the starting policy's own."""
    from datasets import Dataset

    from ..trainers.generation import generate, prompt_texts

    texts, _ = prompt_texts(tokenizer, prompts)
    answers = generate(model, tokenizer, prompts, max_new_tokens, batch_size=8)
    # An answer that is only an end token decodes to "" and has no token to score.
    kept = [i for i, answer in enumerate(answers) if tokenizer(answer, add_special_tokens=False)["input_ids"]]
    if not kept:
        return None
    return Dataset.from_dict({"prompt": [texts[i] for i in kept], "completion": [answers[i] for i in kept]})
