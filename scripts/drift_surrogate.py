"""Surrogates of the held-out drift under a β that changes, on which the drift controller's rule was chosen
(docs/design.md §5, "The drift controller"). No evidence about a model: the real-model study is
(docs/frontier.md, "The drift study").

100 optimizer steps, the drift D measured every 5, β set by the rule after each measurement. Two families of plants:

- **integrating** (on which the second rule was chosen): a velocity v relaxes at rate `c` a step towards a drive minus
  the pull of β, v ← v + c · (drive_t − k · β · D), D ← max(D + v, 0); 8 variations of (k, c, drive) and the one that
  reproduced the first rule's swing on SmolLM2 (k = 0.6, c = 0.25, drive 0.012);
- **levelling**: the velocity relaxes towards (H(β) − D) / τ, so that under a constant β the drift levels off at
  H(β) = 0.22 · ¼ · softplus(4 · log(0.36 / β)), linear in log β above its knee, near the seed means of SmolLM2's final
  drift under constant β (docs/studies/real/drift_sum: 0.134, 0.282, 0.483, 0.636, 0.788 at β = 0.2, 0.1, 0.04, 0.02,
  0.01 against 0.129, 0.361, 0.541, 0.671, 0.820), plus a jitter σ · √D · N(0, 1) a step; 12 variations of (τ, c, σ).

In both the drive rises over the first 15–18 steps (the reward being learned), jumps to a new level with probability
1/20 a step, and each seed scales it. Each plant is weighted by the likelihood of what the earlier rules did on SmolLM2
(the first rule: 0 of 3 runs within ±20% of 0.13, 1 of 2 of 0.6; the second: 2 of 5 and 4 of 5), so a plant on which
they did otherwise counts for little.

    python scripts/drift_surrogate.py

prints each plant's weight, then for the first rule, the second and the package's (`drift_beta`) the weighted share of
simulated runs within ±20% of each target, and the mean and the lowest share over the 21 plants × 2 targets unweighted.
Deterministic: seeds 0–99 of each plant.
"""

from __future__ import annotations

import math

import numpy as np

from adaptive_kl.kl.controller import drift_beta, drift_path


STEPS, EVERY, BETA, BETA_MIN, BETA_MAX, SEEDS, TARGETS = 100, 5, 0.1, 0.004, 1.0, 100, (0.13, 0.6)
INTEGRATING = [dict(k=k, c=c, drive=d) for k in (0.3, 1.0) for c in (0.12, 0.4) for d in (0.007, 0.02)]
INTEGRATING.append(dict(k=0.6, c=0.25, drive=0.012))
LEVELLING = [dict(tau=tau, c=c, jitter=j) for tau in (4, 6, 10) for c in (0.3, 0.5) for j in (0.012, 0.024)]
PLANTS = [("integrating", p) for p in INTEGRATING] + [("levelling", p) for p in LEVELLING]
# (rule, target) → (runs within ±20%, runs) on SmolLM2: docs/studies/real/drift_sum/first_rule and second_rule
OBSERVED = {
    ("first rule", 0.13): (0, 3),
    ("first rule", 0.6): (1, 2),
    ("second rule", 0.13): (2, 5),
    ("second rule", 0.6): (4, 5),
}


def level(beta: float) -> float:
    """H(β): the drift a constant β holds on the levelling plants."""
    x = 4 * math.log(0.36 / max(beta, 1e-6))
    return 0.22 / 4 * (math.log1p(math.exp(-abs(x))) + max(x, 0.0))


def final_drift(seed: int, rule, family: str, plant: dict) -> float:
    """The surrogate's drift at the last step, β set by `rule(measurements)` after each measurement."""
    rng = np.random.default_rng(seed)
    scale, jump, drift, velocity, beta, measured = math.exp(rng.normal(0, 0.25)), 1.0, 0.0, 0.0, BETA, []
    for step in range(1, STEPS + 1):
        if rng.random() < 1 / 20:
            jump = math.exp(rng.normal(0, 0.35))
        if family == "integrating":
            pull = scale * jump * min(1.0, step / 18) ** 2 * plant["drive"] - plant["k"] * beta * drift
            velocity += plant["c"] * (pull - velocity)
            drift = max(drift + velocity, 0.0)
        else:
            height = scale * jump * min(1.0, step / 15) * level(beta)
            velocity += plant["c"] * ((height - drift) / plant["tau"] - velocity)
            drift = max(drift + velocity + plant["jitter"] * math.sqrt(max(drift, 1e-4)) * rng.normal(), 0.0)
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
            beta = min(max(beta * min(max(ratio, 0.5 if step >= STEPS / 4 else 1.0), 2.0), BETA_MIN), BETA_MAX)
        return beta

    return rule


def second_rule(target: float):
    """The package's gains on the drift extrapolated 10 steps along its last slope, the integral floored at β/1000."""

    def rule(measured):
        integral, error, previous = 0.0, 0.0, (0, 0.0)
        for step, drift in measured:
            ahead = drift + (drift - previous[1]) * 10 / (step - previous[0])
            ratio = ahead / drift_path(step + 10, target_drift=target, max_steps=STEPS)
            error = math.log(min(max(ratio, 0.25), 4.0))
            error = max(error, 0.0) if step < STEPS / 4 else error
            integral = min(max(integral + 0.5 * error, math.log(1e-3)), math.log(BETA_MAX / BETA))
            previous = (step, drift)
        return min(max(BETA * math.exp(integral + error), BETA_MIN), BETA_MAX)

    return rule


def package_rule(target: float):
    def rule(measured):
        return drift_beta(
            measured, beta=BETA, beta_min=BETA_MIN, beta_max=BETA_MAX, target_drift=target, max_steps=STEPS
        )

    return rule


def shares(rule_for_target) -> np.ndarray:
    """Per plant (rows) and target (columns), the share of seeds that ended within ±20% of the target."""

    def share(plant, target):
        rule = rule_for_target(target)
        return np.mean([abs(final_drift(seed, rule, *plant) / target - 1) <= 0.2 for seed in range(SEEDS)])

    return np.array([[share(plant, target) for target in TARGETS] for plant in PLANTS])


def plant_weights(by_rule: dict[str, np.ndarray]) -> np.ndarray:
    """Each plant's likelihood of the earlier rules' runs on SmolLM2 (binomial, shares kept in [0.01, 0.99]), summing
    to 1."""
    likelihood = np.ones(len(PLANTS))
    for (rule, target), (hit, runs) in OBSERVED.items():
        share = np.clip(by_rule[rule][:, TARGETS.index(target)], 0.01, 0.99)
        likelihood *= math.comb(runs, hit) * share**hit * (1 - share) ** (runs - hit)
    return likelihood / likelihood.sum()


def table() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The plants' weights and each rule's shares."""
    by_rule = {"first rule": shares(first_rule), "second rule": shares(second_rule)}
    by_rule["the package's rule"] = shares(package_rule)
    return plant_weights(by_rule), by_rule


def main() -> None:
    weights, by_rule = table()
    print("| plant | weight |\n|---|---|")
    for (family, plant), weight in zip(PLANTS, weights):
        print(f"| {family} {plant} | {weight:.3f} |")
    print("\n| rule | weighted share at 0.13 | at 0.6 | mean over plants and targets | lowest |")
    print("|---|---|---|---|---|")
    for name, share in by_rule.items():
        low, high = weights @ share
        print(f"| {name} | {low:.0%} | {high:.0%} | {share.mean():.0%} | {share.min():.0%} |")


if __name__ == "__main__":
    main()
