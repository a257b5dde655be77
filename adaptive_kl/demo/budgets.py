"""The demo's budget for each named policy (`adaptive_kl.tasks.policies`): the task, steps, validation size, LoRA and
config that `adaptive-kl demo --model <name>` trains with, unless the command line says otherwise."""

# The LoRA adapter of a hub model (`--lora-r`, `--lora-alpha`, `--lora-target-modules` override it), as PEFT's
# `LoraConfig` and Unsloth's `get_peft_model` take it; SmolLM2's demo trains the same.
HUB_LORA = {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}

# The real-model demo's budget on 2 CPU cores (five methods in about 30 minutes): 2 prompts × 4 completions of at
# most 64 tokens a step, a LoRA of rank 16 on the attention projections, 20 steps, 64 validation problems.
SMOLLM2_DEMO = {
    "task": "chat",
    "steps": 20,
    "eval_every": 10,
    "n_validation": 64,
    "max_new_tokens": 64,
    "lora": HUB_LORA,
    # Every trainer's fields (the binomial-KL trainer's too)...
    "config": dict(
        learning_rate=2e-4,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=64,
        temperature=1.0,
        gradient_checkpointing=False,
    ),
    # ... and those of the adaptive KL (GRPO's and RLOO's trainers).
    "kl_config": dict(
        beta=0.04,
        reward_threshold=1.0,  # dynamic: β decays once the mean reward (at most 2) reaches 1
    ),
}
POLICY_DEMOS = {"smollm2": SMOLLM2_DEMO}

# A hub model's (any `--model` other than a named policy): GRPO's shape of a small-GPU recipe, 2 prompts × 8
# completions an optimizer step (8 completions a micro-batch, 2 accumulated) of at most 256 tokens. Full fine-tuning at
# 1e-6; a LoRA (`--lora`, and always with `--unsloth`) at `HUB_LORA_LEARNING_RATE`. Each is a config field that
# `--set FIELD=VALUE` overrides.
HUB_MODEL = dict(
    learning_rate=1e-6,
    per_device_train_batch_size=8,
    num_generations=8,
    gradient_accumulation_steps=2,
    max_completion_length=256,
    temperature=1.0,
)
HUB_LORA_LEARNING_RATE = 2e-5
