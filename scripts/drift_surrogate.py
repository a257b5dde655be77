"""A surrogate of the held-out drift under a β that changes, on which the drift controller's rule was chosen
(docs/design.md §5, "The drift controller"). No evidence about a model: the real-model study is
(docs/frontier.md, "The drift study").

The drift D of 100 optimizer steps, measured every 5, moves with a velocity v that relaxes at rate `c` a step towards
a drive minus the pull of β: v ← v + c · (drive_t − k · β · D), D ← max(D + v, 0). The drive rises over the first 18
steps (the reward being learned), then jumps to a new level (a factor e^N(0, 0.35)) with probability 1/20 a step, and
each seed scales it by e^N(0, 0.25). With k = 0.6, c = 0.25 and a drive of 0.012 it reproduces what the first rule did
on SmolLM2 (docs/studies/real/drift_sum/first_rule): the drift swings around the path with a period of 40–50 steps.

    python scripts/drift_surrogate.py

prints, for the first rule and the package's rule (`drift_beta`) at its gains and at its neighbours', the share of
150 seeds whose final drift is within ±20% of the target, for targets 0.13 and 0.6 and 8 variations of (k, c, drive),
and the mean over those 16 cells. Deterministic: seeds 0–149.
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np

from adaptive_kl.kl import controller
from adaptive_kl.kl.controller import drift_beta, drift_path


STEPS, EVERY, BETA, BETA_MAX, SEEDS = 100, 5, 0.1, 1.0, 150
PLANTS = [dict(k=k, c=c, drive=d) for k in (0.3, 1.0) for c in (0.12, 0.4) for d in (0.007, 0.02)]


def final_drift(seed: int, rule, k: float = 0.6, c: float = 0.25, drive: float = 0.012) -> float:
    """The surrogate's drift at the last step, β set by `rule(measurements)` after each measurement."""
    rng = np.random.default_rng(seed)
    scale, level, drift, velocity, beta, measured = math.exp(rng.normal(0, 0.25)), 1.0, 0.0, 0.0, BETA, []
    for step in range(1, STEPS + 1):
        if rng.random() < 1 / 20:
            level = math.exp(rng.normal(0, 0.35))
        pull = scale * level * min(1.0, step / 18) ** 2 * drive - k * beta * drift
        velocity += c * (pull - velocity)
        drift = max(drift + velocity, 0.0)
        if step % EVERY == 0:
            measured.append([step, drift])
            beta = rule(measured)
    return drift


def first_rule(target: float):
    """β ← β · clip(D / P(t), ½, 2) at each measurement, never lowered in the first quarter."""

    def rule(measured):
        beta = BETA
        for step, drift in measured:
            ratio = drift / drift_path(step, target_drift=target, max_steps=STEPS)
            beta = min(beta * min(max(ratio, 0.5 if step >= STEPS / 4 else 1.0), 2.0), BETA_MAX)
        return beta

    return rule


def package_rule(target: float):
    return lambda measured: drift_beta(
        measured, beta=BETA, beta_min=0.0, beta_max=BETA_MAX, target_drift=target, max_steps=STEPS
    )


def within(rule_for_target) -> list[float]:
    """Per (plant, target) cell, the share of seeds that ended within ±20% of the target."""
    shares = []
    for plant in PLANTS:
        for target in (0.13, 0.6):
            ends = np.array([final_drift(seed, rule_for_target(target), **plant) for seed in range(SEEDS)])
            shares.append(float(np.mean(np.abs(ends / target - 1) <= 0.2)))
    return shares


GAINS = [(10, 1.0, 0.5), (5, 1.0, 0.5), (15, 1.0, 0.5), (10, 1.0, 0.25), (5, 2.0, 0.25), (10, 1.5, 0.35)]


def main() -> None:
    print("| rule | mean within ±20% | min | per (k, c, drive) × target 0.13, 0.6 |\n|---|---|---|---|")
    rows = [("first rule", None)] + [(f"H={h} K_p={p} K_i={i}", (h, p, i)) for h, p, i in GAINS]
    package = (controller.DRIFT_HORIZON, controller.DRIFT_PROPORTIONAL_GAIN, controller.DRIFT_INTEGRAL_GAIN)
    for name, gains in rows:
        if gains is None:
            shares = within(first_rule)
        else:
            names = ("DRIFT_HORIZON", "DRIFT_PROPORTIONAL_GAIN", "DRIFT_INTEGRAL_GAIN")
            with mock.patch.multiple(controller, **dict(zip(names, gains))):  # drift_beta reads them at each call
                shares = within(package_rule)
            name += " (the package's)" if gains == package else ""
        print(f"| {name} | {np.mean(shares):.2f} | {min(shares):.2f} | {' '.join(f'{s:.2f}' for s in shares)} |")


if __name__ == "__main__":
    main()
