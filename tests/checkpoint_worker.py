"""A training run that saves a checkpoint every step and is killed (SIGKILL) in the middle of a later step:
`python tests/checkpoint_worker.py MODEL_DIR OUTPUT_DIR KILL_AT_STEP`.

The process dies inside the reward function of step KILL_AT_STEP, as a preempted or crashed job does: no exception
handler, no `on_train_end`, nothing flushed. `tests/trainers/test_checkpoints.py` resumes from what it left behind.
"""

from __future__ import annotations

import os
import signal
import sys


sys.path.insert(0, os.path.dirname(__file__))

# The run, shared with tests/trainers/test_checkpoints.py: the adaptive controller makes β depend on every step's KL,
# so only a restored controller state gives the uninterrupted trajectory. β falls 5% after step 1 (KL 0), is held
# after step 2 (every group's rewards agree), rises 5% a step and meets its ceiling, beta_max, at step 6.
RUN = dict(
    beta=0.2,
    kl_adaptation_method="sigmoid",
    kl_controller="adaptive",
    target_kl=1e-3,
    kl_horizon=16,
    beta_max=0.21,
    max_steps=6,
    learning_rate=5e-2,
    save_strategy="steps",
    save_steps=1,
)
KILL_AT_STEP: int | None = None


AGREE_AT_STEP = 2  # every completion earns the same: no group has an advantage, the controller holds β


def indexed_reward(completions, trainer_state=None, **kwargs):
    """Content-blind rewards (the same for every run whatever its policy does); dies at step `KILL_AT_STEP`."""
    if KILL_AT_STEP is not None and trainer_state.global_step + 1 == KILL_AT_STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return [float(i % 4) for i in range(len(completions))]


def agreeing_reward(completions, trainer_state=None, **kwargs):
    """The run's reward: `indexed_reward`, except that every completion of step `AGREE_AT_STEP` earns the same."""
    rewards = indexed_reward(completions, trainer_state=trainer_state, **kwargs)
    return [1.0] * len(rewards) if trainer_state.global_step + 1 == AGREE_AT_STEP else rewards


if __name__ == "__main__":
    model_dir, output_dir, KILL_AT_STEP = sys.argv[1], sys.argv[2], int(sys.argv[3])

    from tiny import make_trainer

    from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
    from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed

    install_cpu_scorer_if_needed()
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        model_dir,
        reward_funcs=[agreeing_reward],
        output_dir=output_dir,
        **RUN,
    )
    trainer.train()
    raise SystemExit(f"the run was not killed at step {KILL_AT_STEP}")
