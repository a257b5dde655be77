"""Runs the real-model studies of `docs/studies/real/` (SmolLM2-135M-Instruct), one run per variant and seed, and
survives sessions: a finished run is never redone.

    python scripts/run_real_studies.py                          # every run not yet done, two side by side
    python scripts/run_real_studies.py --only length --seeds 0,1,2
    python scripts/run_real_studies.py --summarize              # only rewrite the summaries from the runs so far
    python scripts/run_real_studies.py --only length --variants "beta=0 loss_type=grpo"   # runs that fit the time left
    nohup python scripts/run_real_studies.py > real-studies.log 2>&1 &     # in the background (hours on 2 cores)
    python scripts/run_real_studies.py --stop-file ../stop-runner        # `touch ../stop-runner`: no new run starts

Each run is one `adaptive-kl compare --model smollm2 --variant ... --seed S` into
`docs/studies/real/<study>/runs/<variant>/seed-<S>/`, which holds its own `summary.md`, `metrics.csv` and `runs.json`
(the run, in full). A run whose `runs.json` exists is finished and skipped; one without it (killed mid-way) goes on
from its latest checkpoint: every run saves one every `CHECKPOINT_EVERY` steps (`--save-every`, `--resume`: a resumed
run reports what the uninterrupted one does, tests/demo/test_resume.py), so a session that ends loses at most that
many steps of each run in flight. A finished run or a checkpoint is reused only when it was trained with the setup of
the command the runner gives it (`sweep.setup_conflicts`, as `adaptive-kl frontier` checks; runs made before runs
recorded their command are taken as they are): otherwise the runner stops before training, naming the options that
differ (`--restart-changed` trains them again, their directories moved aside). After every finished run, the study's
`summary.md`, `metrics.csv` and plots are rewritten from all the runs found so far, with the seeds each variant has.
Runs are ordered seed by seed (every variant's seed 0, then seed 1, ...), so partial results stay balanced.

A run in flight is claimed by its runner (`running.pid` in its directory, holding the runner's process id), so a
second runner started later on the same machine (more cores free, say) takes the next unclaimed run instead of
repeating one; a claim left by a runner that no longer lives is taken over.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)  # this checkout's package (a study's worktree), whatever is installed

from adaptive_kl.demo.run_files import has_runs  # noqa: E402
from adaptive_kl.demo.sweep import (  # noqa: E402
    CLAIM_FILE,  # noqa: F401 (the tests')
    SweepRun,
    provenance_lines,
    reuse_only_own_setups,
    run_devices,
    run_sweep,
)
from adaptive_kl.usage import UsageError  # noqa: E402


if TYPE_CHECKING:
    from adaptive_kl.demo.frontier import Frontier
    from adaptive_kl.demo.runner import VariantRun


STUDIES_DIR = os.path.join(
    "docs", "studies", "real"
)  # relative to the repository: summaries record a portable command

# The real model's budget on a 2-core CPU, measured with one thread: ~18 s a step for 2 prompts × 4 completions of at
# most 64 tokens, ~37 s at 128 tokens (4 steps of the length study's first variant: 155 s, and ~35 s an evaluation of
# the 64 validation problems). The planned 65 min a length-study run (100 steps, 5 evaluations) turned out to depend
# on where the length goes: 24–37 min for β = 0 (its completions shrink to 4–24 tokens), 61–74 min for k3 in the loss
# and 73–95 min for k1 summed in the reward (~57–64 tokens), 74–110 min for k1 per token (they grow to 85–103): ~17 h
# of one core for 5 variants × 3 seeds, about three sessions of two runs side by side. A β-study run (100 steps of
# 64 tokens) took 28–41 min.
LENGTH_PER_TOKEN = "beta=0.2 loss_type=grpo kl_placement=reward kl_estimator=k1 kl_adaptation_method=length_normalized"
LENGTH_ARGS = [
    "--model", "smollm2", "--steps", "100", "--eval-every", "25",
    "--set", "reward_weights=[1.0, 0.0]", "--set", "max_completion_length=128",
]  # fmt: skip
METHODS_BASE = "beta=0.2 loss_type=grpo"  # k3 in the loss (the defaults)
METHODS_NONE = f"{METHODS_BASE} kl_adaptation_method=none"
# `dynamic` at seed 001's values (its decay 0.9, threshold 0.8 and floor 0): the demo's own (0.95, 1.0 or 1.4, 0.004)
# would apply otherwise. The saturation trigger at its default threshold, 0.5.
METHODS_DYNAMIC = f"{METHODS_BASE} kl_adaptation_method=dynamic dynamic_beta_decay=0.9 beta_min=0"
METHODS_REWARD_TRIGGER = f"{METHODS_DYNAMIC} reward_threshold=0.8"
METHODS_SATURATION = f"{METHODS_DYNAMIC} dynamic_trigger=saturation"
# Constant β's points of the frontier study, in order of β (0 and 0.2 are the length study's runs), and the methods it
# places against them (the methods study's arms).
FRONTIER_LINE = [f"beta={beta} loss_type=grpo" for beta in ("0", "0.02", "0.05", "0.1", "0.2")]
FRONTIER_METHODS = [
    *(f"{METHODS_BASE} kl_adaptation_method={m}" for m in ("clip", "sigmoid")),
    LENGTH_PER_TOKEN,
    METHODS_REWARD_TRIGGER,
    METHODS_SATURATION,
]
# Step 2's arms (issue 59; the rule is stated above the `frontier` entry, before their runs). target_kl is the rule's
# value: the mean `adaptive_kl/raw_kl` over the 100 logged steps of each of β = 0.05's seeds 0-2, 3 significant digits
# (tests/demo/test_real_studies.py recomputes it from the committed runs). The controller's floor is `compare`'s
# `beta_min`, 0.004, as in the pilot.
FRONTIER_LOG_SCALING = f"{METHODS_BASE} kl_scaling=log"
FRONTIER_TARGET_KL = "0.147"
FRONTIER_STEPWISE = f"{METHODS_BASE} kl_controller=stepwise target_kl={FRONTIER_TARGET_KL}"
FRONTIER_STEP_2 = [FRONTIER_LOG_SCALING, FRONTIER_STEPWISE]
# Step 3 (issue 70): the target-KL controllers with a ceiling and the hold on steps whose groups all agreed, at step
# 2's target and floor. beta_max=0.2 is the default ceiling (β's start), written out so that the bounded stepwise is
# not step 2's command. `adaptive`'s horizon is the one the config's warning names for this run: β moved 10x in half
# of 100 steps of 8 sequences, 35 (at the default 10,000, β moves 1.6% at most, and the warning names 35).
FRONTIER_BOUNDED_STEPWISE = f"{FRONTIER_STEPWISE} beta_max=0.2"
FRONTIER_BOUNDED_ADAPTIVE = (
    f"{METHODS_BASE} kl_controller=adaptive target_kl={FRONTIER_TARGET_KL} kl_horizon=35 beta_max=0.2"
)
FRONTIER_STEP_3 = [FRONTIER_BOUNDED_STEPWISE, FRONTIER_BOUNDED_ADAPTIVE]
# The second frontier (issue 69): the β study's setting (the full reward, 64 tokens), where reward can keep rising
# with drift. Its constant-β line; β = 0, 0.04 and 0.2 are the β study's runs (the same command; each run's first two
# steps were checked bit for bit against the current code before reuse, docs/studies/README.md).
BETA_ARGS = ["--model", "smollm2", "--steps", "100", "--eval-every", "25"]
SUM_LINE = [f"beta={beta}" for beta in ("0", "0.01", "0.02", "0.04", "0.1", "0.2")]
SUM_BASE = "beta=0.2"  # every method adapts from the line's strongest β, as in the frontier study
# `dynamic` at seed 001's values (decay 0.9, floor 0) with reward_threshold 0.8 on this reward's scale of 2 (format 1
# + correct sum 1): the step's mean reward reaches 0.8 once ~80% of the completions have the format, the plateau where
# a constant β holds the policy (β = 0.2's runs did so on 7-18 steps from step 29-42 on). 0.8 of the maximum, 1.6,
# needs the sum learned first, which no β > 0 of the β study did: that arm would never decay and test nothing.
SUM_DYNAMIC = f"{SUM_BASE} kl_adaptation_method=dynamic dynamic_beta_decay=0.9 beta_min=0 reward_threshold=0.8"
# The target-KL controller's target, by the frontier study's rule on this line's middle β: the mean
# `adaptive_kl/raw_kl` over the 100 logged steps of each of β = 0.04's seeds 0-2, 3 significant digits.
SUM_TARGET_KL = "0.184"
SUM_STEPWISE = f"{SUM_BASE} kl_controller=stepwise target_kl={SUM_TARGET_KL} beta_max=0.2"  # the default ceiling
SUM_METHODS = [f"{SUM_BASE} kl_adaptation_method=clip", f"{SUM_BASE} kl_scaling=log", SUM_DYNAMIC, SUM_STEPWISE]
SUM_SIGMOID = f"{SUM_BASE} kl_adaptation_method=sigmoid"  # if the cores allow, after the others' five seeds
# The start's point on every seed's line (issue 69), stated before the second frontier's runs: drift 0 (the start's
# held-out KL to itself) and, for the reward, the mean reward of the first `START_STEPS` steps of that seed's
# constant-β runs: the endpoint's own quantity (sampled completions of training prompts, scored by the training
# reward), where the policy has barely moved; the first evaluation measures greedy answers to validation problems,
# another quantity. The secondaries at the start: Δ retention 0 and Δ length 0 (nothing has changed), the format-free
# accuracy of the step-0 evaluation.
START_STEPS = 5
STUDIES = {
    # Length exploitation on a real model: a reward that saturates (the `####` format alone), room to lengthen (128
    # tokens; the model's answers average ~57 tokens), a β large enough to drive the policy once the advantages
    # vanish, and placements with opposite length incentives. β = 0 first: paired differences are the KL's effect.
    # The matched-strength arm (k1 summed at β = 0.00333) separates "dividing by the length" from "a weaker penalty":
    # k1 per token at β = 0.2 is the summed penalty at β = 0.2 / L for answers of L tokens, and the starting mean
    # completion length, measured over the first 5 steps of the 15 runs of seeds 0-2, is 60.09 tokens: 0.2 / 60.09 =
    # 0.00333. Its primary endpoint, stated before its runs: the paired Δ length (last − first quarter) of k1 per
    # token minus k1 summed at 0.00333, over seeds 0-4 (t with 4 degrees of freedom).
    "length": {
        "variants": [
            "beta=0 loss_type=grpo",
            LENGTH_PER_TOKEN,
            "beta=0.00333 loss_type=grpo kl_placement=reward kl_estimator=k1",
            "beta=0.2 loss_type=grpo kl_placement=reward kl_estimator=k1",
            "beta=0.2 loss_type=grpo",
            "beta=0.2 loss_type=dr_grpo",
        ],
        "seeds": "0,1,2,3,4",
        # The primary endpoint (variant − against, paired on seeds; a key of the report's `summarize`).
        "endpoints": [
            {
                "variant": LENGTH_PER_TOKEN,
                "against": "beta=0.00333 loss_type=grpo kl_placement=reward kl_estimator=k1",
                "metric": "length_drift",
            }
        ],
        "args": LENGTH_ARGS,
    },
    # Does the KL matter on a real model: no KL, the demo's β and a larger one, on the full task reward.
    "beta": {
        "variants": ["beta=0", "beta=0.04", "beta=0.2"],
        "args": BETA_ARGS,
        "seeds": "0,1,2",
        # Its seeds 3-4 are made here for the second frontier, which reuses them: this study's summary, and the
        # reading the docs quote, stay at its own 3 seeds.
        "summarizes_own_seeds_only": True,
    },
    # The five methods where length exploitation can happen: the length study's setting (format-only reward, 128
    # tokens, 100 steps), k3 in the loss with `grpo` at β = 0.2, 5 seeds. Its `none` and β = 0 are the length study's
    # runs, reused because the commands are the same (tests/demo/test_real_studies.py builds both). Each method's
    # parameters are seed 001's defaults, which pilots showed acting here (docs/studies/README.md, "The five methods
    # where answers can lengthen"): `clip` at 1.0 clipped tokens from step 12 of a 40-step pilot on; `sigmoid` at
    # τ = 0.1 weighs the near-zero KL of the first steps by ~0.48; `dynamic` (decay 0.9, threshold 0.8, floor 0): the
    # `none` runs (the same run until a first decay) reach a mean reward of 0.8 at steps 16-44. `length_normalized` is
    # `none` bit for bit with k3 in the loss under `grpo` (both aggregate mean_i Σ_t k / L_i;
    # tests/trainers/test_methods.py), so its arm is where the method acts, k1 per token in the reward at the same β:
    # the length study's runs, reused. The saturation trigger is a fifth arm, run after the others' five seeds (its own
    # phase). Primary endpoints (stated before the runs): each method minus `none`, paired on seeds, of Δ length (last
    # − first quarter) and the held-out KL to the start (t, n − 1 df).
    "methods": {
        "variants": [
            METHODS_NONE,
            "beta=0 loss_type=grpo",
            *(f"{METHODS_BASE} kl_adaptation_method={m}" for m in ("clip", "sigmoid")),
            LENGTH_PER_TOKEN,
            METHODS_REWARD_TRIGGER,
            METHODS_SATURATION,
        ],
        "reused": {
            METHODS_NONE: ("length", METHODS_BASE),
            "beta=0 loss_type=grpo": ("length", "beta=0 loss_type=grpo"),
            LENGTH_PER_TOKEN: ("length", LENGTH_PER_TOKEN),
        },
        "phases": [[METHODS_SATURATION]],
        "endpoints": [
            {"variant": variant, "against": METHODS_NONE, "metric": metric}
            for variant in (
                *(f"{METHODS_BASE} kl_adaptation_method={m}" for m in ("clip", "sigmoid")),
                LENGTH_PER_TOKEN,
                METHODS_REWARD_TRIGGER,
                METHODS_SATURATION,
            )
            for metric in ("length_drift", "final_kl_to_start")
        ],
        "args": LENGTH_ARGS,
        "seeds": "0,1,2,3,4",
    },
    # Constant β's frontier (issue 59): does any method earn more reward than a constant β at the same drift? The
    # methods study's setting and seeds; constant β at 0.02, 0.05 and 0.1 between the two it had (0 and 0.2, reused),
    # every method of the methods study on the same picture (reused; the saturation arm's seeds 3-4 are made in the
    # methods study). Seeds 0-2 of every β first, then 3-4 (the runner goes seed by seed).
    #
    # Primary endpoint, stated before the runs (the `frontier` entry below): for each method m and seed s,
    # D(m, s) = R(m, s) − F_s(KL(m, s)), where R is the reward of the last quarter of steps, KL the held-out KL to
    # the start at step 100, and F_s constant β's frontier on seed s: the piecewise-linear interpolation of R against
    # KL through seed s's five constant-β runs (β = 0, 0.02, 0.05, 0.1, 0.2) taken in order of their KL,
    # held flat beyond its first and last points (a method that drifts further than β = 0 is read against β = 0's
    # reward, one that drifts less than β = 0.2 against β = 0.2's). Why this interpolation: it passes through every
    # measured point and assumes no shape for the curve between adjacent ones (no model of reward against KL is known
    # for this task; the β grid is close to geometric, so neighbours are near in KL); why per seed: the seed fixes the
    # prompts' order, the sampling stream and the LoRA's start, which every arm of a seed shares, so the difference
    # cancels what a seed does to every arm. Reported: mean ± 95% t half-width (n − 1 df) of D over the seeds, with a
    # two-sided paired t-test whose p-values are Holm-adjusted across the methods (family-wise α = 0.05). The mirror,
    # reported beside it: KL(m, s) − G_s(R(m, s)), the held-out KL above the least KL at which seed s's frontier (the
    # same curve) reaches the method's reward (its KL at its highest reward when it never does). Secondary, at matched
    # drift (the same interpolation of each metric against KL, no Holm): Δ retention log-likelihood, format-free
    # accuracy (final) and Δ length (last − first quarter).
    #
    # Step 2, stated before its runs, which start once step 1's have finished: seed 000's step scaling
    # (`kl_scaling=log` at β = 0.2) and seed 003's target-KL controller (`kl_controller=stepwise`, its ×1.5 / ×0.75
    # band rule, starting from β = 0.2) with target_kl = the mean training KL (`adaptive_kl/raw_kl` over every logged
    # step) of the β = 0.05 point over seeds 0-2, rounded to 3 significant digits: a drift inside the frontier's
    # measured range, where the controller can land above, on or below it. Before its 5 seeds, a pilot (seed 0, 25
    # steps, outside the study) must show the controller moving β; both arms (FRONTIER_STEP_2) join the methods read
    # against the frontier and the Holm family.
    #
    # Step 3 (issue 70), stated before its runs: the bounded controllers (FRONTIER_STEP_3), 5 seeds each, read with
    # the study's endpoint (D, stated and with the start on the line, Holm with the other methods) and, for each, the
    # last quarter's training KL (`adaptive_kl/raw_kl`, steps 76-100) / target_kl, its largest β and its last quarter's
    # format reward. The claim they test: the bounded controller does not collapse (on every seed its reward is at
    # least half the seed's line at its drift, where step 2's collapsed seeds had 0.04-0.29 against ~0.6-0.9, and D
    # with the start on the line is not below 0 at 95%) and lands within ±50% of its target (the 95% interval of the
    # KL / target ratio inside [0.5, 1.5]). Whatever it shows goes to the README and the studies page.
    "frontier": {
        "variants": [*FRONTIER_LINE, *FRONTIER_METHODS, *FRONTIER_STEP_2, *FRONTIER_STEP_3],
        "phases": [FRONTIER_STEP_2, FRONTIER_STEP_3],  # each after every seed of the runs before it
        "reused": {
            "beta=0 loss_type=grpo": ("length", "beta=0 loss_type=grpo"),
            "beta=0.2 loss_type=grpo": ("length", METHODS_BASE),
            LENGTH_PER_TOKEN: ("length", LENGTH_PER_TOKEN),
            **{m: ("methods", m) for m in FRONTIER_METHODS if m != LENGTH_PER_TOKEN},
        },
        # Said in the summary's opening (issue 90): what a reader of its tables must know that they do not show.
        "notes": [
            "Format-free accuracy, two readers: the 10 runs of the bounded controllers (`777d5cf842`) take the "
            "number the `####` line concludes with (`tasks.answers.final_number`), the 60 others the first number "
            "after `####`, the reader before it (`#### 4 + 13 = 17` reads 4). The bounded controllers' format-free "
            "accuracy, and its difference from constant β's at matched drift, set the one reader against the other: "
            "not a difference between methods.",
        ],
        "frontier": {
            "line": FRONTIER_LINE,
            "x": "final_kl_to_start",
            "y": "late_reward",
            "secondary": ["delta_retention", "final_answer_accuracy", "length_drift"],
            # What the reward can take here (for the picture's bars; the endpoint does not use it): the format reward
            # is 0 or 1 per completion and the accuracy reward is weighted 0 (`reward_weights=[1.0, 0.0]`), so a
            # step's mean reward, and its mean over steps and seeds, lies in [0, 1].
            "y_range": (0.0, 1.0),
            # Issue 69, after the runs: the start's point on every seed's line (the second frontier's rule, stated
            # before its runs), a correction reported beside the stated D.
            "start_steps": START_STEPS,
            "start_added_after_runs": True,
        },
        "args": LENGTH_ARGS,
        "seeds": "0,1,2,3,4",
        "setting": "The format reward, 128 tokens (`frontier`)",  # a panel's title beside another frontier
    },
    # The second frontier (issue 69): where reward keeps rising with drift, does any method buy more reward than a
    # constant β at the same drift? The β study's setting (its command: the full reward, format + correct sum, 0 to 2;
    # 64 tokens; 100 steps), where only β = 0 learned the sum (2 of 3 seeds) and a constant β held the policy at the
    # format plateau. Constant β at 0, 0.01, 0.02, 0.04, 0.1 and 0.2 (the grid, no pilot), seeds 0-4, every
    # β's seeds 0-2 first; then the methods (phase 1), then `sigmoid` (phase 2). Stated before the first run:
    #
    # Primary endpoint: for each method m and seed s, D(m, s) = R(m, s) − F_s(KL(m, s)): R the reward of the last
    # quarter of steps, KL the held-out KL to the start at step 100, F_s the piecewise-linear interpolation of R
    # against KL through the start's point (KL 0, the reward of the first START_STEPS steps of seed s's constant-β
    # runs) and seed s's six constant-β points, in order of KL, held flat beyond the last (a method that drifts
    # further than every constant β is read against the one that drifted most). Mean ± 95% t half-width (n − 1 df)
    # over the seeds, two-sided paired t-test, Holm across the methods (clip, log, dynamic, the bounded controller,
    # and sigmoid if run; family-wise α 0.05). Sensitivity analysis, labelled as such: D against the line's monotone
    # envelope (the most reward it reaches at the method's drift or less). For the controller also its last-quarter
    # training KL / target (mean ± half-width). Secondaries at matched drift (the same interpolation, no Holm): the
    # correct-sum accuracy of the greedy validation answers (final), the format-free accuracy (final), Δ length and Δ
    # retention; the drift beyond the line's at the same reward (the mirror). Per seed, whether each run learned the
    # sum: its last quarter's mean accuracy reward (the fraction of completions with the right number after ####)
    # reaches 0.3, the middle of the β study's gap (0.005-0.06 for the runs that did not, 0.55-0.665 for those that
    # did); per arm the count of seeds with an exact (Clopper-Pearson) 95% interval.
    #
    # The methods adapt from β = 0.2 with seed 001's parameters: `clip` (threshold 1.0), `kl_scaling=log`, `dynamic`
    # (SUM_DYNAMIC), `sigmoid` (τ 0.1), and the bounded target-KL controller of issue 70 (its ceiling and its hold on
    # steps whose groups all agreed landed before the line's first run): `stepwise` from β = 0.2 at target_kl
    # SUM_TARGET_KL, its ceiling at the default (β's start, 0.2), its floor compare's 0.004; for it also the last
    # quarter's training KL / target.
    "frontier_sum": {
        "variants": [*SUM_LINE, *SUM_METHODS, SUM_SIGMOID],
        "phases": [SUM_METHODS, [SUM_SIGMOID]],
        "reused": {variant: ("beta", variant) for variant in ("beta=0", "beta=0.04", "beta=0.2")},
        "notes": [
            "Format-free accuracy, two readers: the 9 reused runs (beta=0, 0.04 and 0.2, seeds 0-2, made before "
            "provenance was recorded) take the first number after `####`, the reader before "
            "`tasks.answers.final_number` (`#### 4 + 13 = 17` reads 4), the 46 others (`777d5cf842`) the number the "
            "`####` line concludes with. The format-free columns mix the two in the rows of beta=0, 0.04 and 0.2 and "
            "in every paired difference from beta=0; the study's endpoints do not read this metric "
            "([reuse check](reuse-check.md)).",
        ],
        "frontier": {
            "line": SUM_LINE,
            "x": "final_kl_to_start",
            "y": "late_reward",
            "secondary": ["final_accuracy", "length_drift", "delta_retention"],
            # The format reward and the accuracy reward are 0 or 1 per completion, weighted 1 each: a step's mean
            # reward, and its mean over steps and seeds, lies in [0, 2].
            "y_range": (0.0, 2.0),
            "start_steps": START_STEPS,
            "learned": ("rewards/accuracy_reward/mean", 0.3),
        },
        "args": BETA_ARGS,
        "seeds": "0,1,2,3,4",
        "setting": "Format + correct sum, 64 tokens (`frontier_sum`)",
        "beside": "frontier",  # its summary also draws both frontiers side by side (issue 69)
    },
}  # fmt: skip
# The drift controller on the second frontier (issue 107), stated before its runs: in frontier_sum's setting and seeds,
# `kl_controller=drift` from β = 0.1 (the line's middle) with a ceiling of 1 (5x the line's strongest β), compare's
# floor 0.004 and the defaults (measured every 5 steps on the first 32 of the 64 held-out solutions the frontier's
# drift is read on), at two targets read off the constant-β line's mean final drift: a small one at β = 0.2's
# (0.1287 → 0.13) and a large one between β = 0.04's and 0.02's (0.5406 and 0.6707 → 0.6). Primary endpoints, one per
# target: D, as in frontier_sum, against seed s's line (reused from it), Holm across the two. Beside them, every run's
# final drift over its target (goal: within ±20%) and the seeds' spread of final drift beside constant β's.
DRIFT_BASE = "beta=0.1 kl_controller=drift beta_max=1"
DRIFT_ARMS = [f"{DRIFT_BASE} target_drift={target}" for target in ("0.13", "0.6")]
STUDIES["drift_sum"] = {
    "variants": [*SUM_LINE, *DRIFT_ARMS],
    # The line's runs are frontier_sum's (three of them the β study's): the same commands, not rerun.
    "reused": {
        variant: STUDIES["frontier_sum"]["reused"].get(variant, ("frontier_sum", variant)) for variant in SUM_LINE
    },
    "frontier": STUDIES["frontier_sum"]["frontier"],
    "args": BETA_ARGS,
    "seeds": "0,1,2,3,4",
    "setting": "Format + correct sum, 64 tokens, the drift controller (`drift_sum`)",
}
DEFAULT_SEEDS = "0,1,2"


# Checkpointing is how a run is executed, not what it computes (saving and resuming change no logged value), so it is
# not part of a run's command (`Run.command`): a run reused from another study is the same command either way.
CHECKPOINT_EVERY = 25


@dataclass(frozen=True)
class Run:
    study: str
    variant: str
    seed: int

    @property
    def sweep_run(self) -> SweepRun:
        return SweepRun(self.variant, self.seed)

    def directory(self, out: str) -> str:
        return self.sweep_run.directory(os.path.join(out, self.study))

    def command(self, out: str, studies: dict) -> list[str]:
        return self.sweep_run.command(studies[self.study]["args"], os.path.join(out, self.study))


def study_seeds(studies: dict, name: str, seeds: list[int] | None = None) -> list[int]:
    """`seeds` when given (`--seeds`), else the study's own (its `seeds` entry, or DEFAULT_SEEDS)."""
    if seeds is not None:
        return seeds
    return [int(s) for s in studies[name].get("seeds", DEFAULT_SEEDS).split(",")]


def planned_runs(studies: dict, names: list[str], seeds: list[int] | None = None) -> list[Run]:
    """Every run of the studies, seed by seed (all variants of seed 0 first), the studies in their order; `seeds`
    (default: each study's own) for every study. A study's `phases` (lists of its variants) come after every seed of
    its other variants, one phase after another."""
    return [
        Run(name, variant, seed)
        for name in names
        for phase in range(len(studies[name].get("phases", ())) + 1)
        for seed in study_seeds(studies, name, seeds)
        for variant in studies[name]["variants"]
        if variant_phase(studies[name], variant) == phase
    ]


def variant_phase(study: dict, variant: str) -> int:
    """0 for a variant in none of the study's `phases`, else 1 + the index of the phase that holds it."""
    return next((i + 1 for i, phase in enumerate(study.get("phases", ())) if variant in phase), 0)


def source_run(run: Run, studies: dict) -> Run:
    """The run whose files are `run`'s: itself, or for a variant the study reuses from another study (`reused`), that
    study's run of the same seed."""
    reused = studies[run.study].get("reused", {}).get(run.variant)
    return run if reused is None else Run(reused[0], reused[1], run.seed)


def variant_key(variant: str) -> str:
    """One spelling of a variant, whether written as the study lists it (`beta=0 loss_type=grpo`) or as `compare`
    names it (`beta=0, loss_type=grpo`)."""
    return " ".join(variant.replace(",", " ").split())


def finished(run: Run, out: str) -> bool:
    return has_runs(os.path.join(REPOSITORY, run.directory(out)))


def execute_argv(run: Run, out: str, studies: dict) -> list[str]:
    """The command line the runner executes (`sweep.SweepRun.command`): the run's command with checkpointing."""
    return run.sweep_run.command(studies[run.study]["args"], os.path.join(out, run.study), CHECKPOINT_EVERY)


def recorded_command(run: Run, out: str, studies: dict) -> str:
    """The command `runs.json`'s provenance records for `run` (`command.provenance`): `adaptive-kl compare ...`, the
    arguments of the command line the runner executes after `python -m adaptive_kl`, as the shell would read them."""
    return "adaptive-kl " + shlex.join(execute_argv(run, out, studies)[3:])


def summarize(name: str, out: str, studies: dict, seeds: list[int] | None = None) -> str | None:
    """Rewrites `<out>/<name>/summary.md`, `metrics.csv` and plots from the study's finished runs; returns the
    summary's path (None when no run is finished yet)."""
    from adaptive_kl.demo.frontier import write_frontier_report, write_frontiers_plot
    from adaptive_kl.demo.report import PairedEndpoint, write_report
    from adaptive_kl.metrics.environment import environment_lines

    variants = [", ".join(v.split()) for v in studies[name]["variants"]]  # as `compare --variant` names them
    found, runs = finished_runs(name, out, studies, seeds)
    counts, wall_time, provenances = {}, 0.0, []
    for run, trained in zip(found, runs, strict=True):
        label = ", ".join(run.variant.split())
        counts[label] = counts.get(label, 0) + 1
        wall_time += trained.wall_time
        provenances.append(trained.provenance)
    if not runs:
        return None
    script = os.path.relpath(os.path.abspath(__file__), REPOSITORY)
    devices = run_devices([os.path.join(REPOSITORY, source_run(run, studies).directory(out)) for run in found])
    environment = [
        # The runs' own machines and threads (this process's are not theirs).
        f"- devices of the runs: {devices}" if line.startswith("- device:") else line
        for line in environment_lines(f"python {script} --only {name}")
    ]
    notes = "\n".join(
        [
            f"Real-model study `{name}`: SmolLM2-135M-Instruct (LoRA r16), the chat task; every run is "
            f"`python -m adaptive_kl compare {shlex.join(studies[name]['args'])} --variant <variant> --seed <s>`.",
            "",
            "Seeds so far: " + "; ".join(f"{label}: {counts.get(label, 0)}" for label in variants) + ".",
            *(
                f"Reused, not rerun: {', '.join(variant.split())} is the `{study}` study's "
                f"{', '.join(source.split())} (the same command)."
                for variant, (study, source) in studies[name].get("reused", {}).items()
            ),
            *(line for note in studies[name].get("notes", ()) for line in ("", note)),  # a paragraph each
            "",
            *environment,
            f"- wall time: {wall_time / 3600:.2f} h of single-core training and evaluation over {len(runs)} "
            f"run{'s' if len(runs) > 1 else ''} "
            "(each run's own summary.md records its machine, versions and command)",
            *provenance_lines(provenances),
        ]
    )
    endpoints = [
        PairedEndpoint(
            variant=", ".join(stated["variant"].split()),
            against=", ".join(stated["against"].split()),
            metric=stated["metric"],
        )
        for stated in studies[name].get("endpoints", ())
    ]
    directory = os.path.join(REPOSITORY, out, name)
    title = f"Real-model study: {name}"
    frontier = study_frontier(name, studies)
    if frontier is None:
        return write_report(runs, directory, title, notes, endpoints, with_activity=True)["summary"]
    summary = write_frontier_report(runs, directory, title, notes, frontier, endpoints, plot=FRONTIER_PLOT)["summary"]
    beside = studies[name].get("beside")
    if beside is not None:  # this study's frontier beside another's, in one picture
        panels = [
            (finished_runs(beside, out, studies)[1], study_frontier(beside, studies), studies[beside]["setting"]),
            (runs, frontier, studies[name]["setting"]),
        ]
        if write_frontiers_plot(panels, os.path.join(directory, FRONTIERS_PLOT)):
            with open(summary, "a") as f:
                f.write(
                    f"\n## Both frontiers\n\nThe `{beside}` study's frontier (left) and this one's (right), each "
                    f"drawn as above:\n\n![Both frontiers]({FRONTIERS_PLOT})\n"
                )
    return summary


def finished_runs(
    name: str, out: str, studies: dict, seeds: list[int] | None = None
) -> tuple[list[Run], list[VariantRun]]:
    """The study's finished runs (a reused one from the study that made it), baseline variant first, and each loaded,
    named and seeded as `compare --seed` names its runs (so a report groups the seeds of a variant). Its seeds: its
    own or `seeds`, and those found in its directories unless it `summarizes_own_seeds_only` (runs made there for a
    study that reuses them)."""
    from adaptive_kl.demo.run_files import load_runs

    read = set(study_seeds(studies, name, seeds))
    if not studies[name].get("summarizes_own_seeds_only"):
        read |= found_seeds(name, out, studies)
    found = [run for run in planned_runs(studies, [name], sorted(read)) if finished(source_run(run, studies), out)]
    found.sort(key=lambda run: (studies[name]["variants"].index(run.variant), run.seed))
    runs = []
    for run in found:
        (trained,) = load_runs(os.path.join(REPOSITORY, source_run(run, studies).directory(out)))
        label = ", ".join(run.variant.split())
        trained.name, trained.config = f"{label}, seed={run.seed}", {**trained.config, "seed": run.seed}
        runs.append(trained)
    return found, runs


def study_frontier(name: str, studies: dict) -> Frontier | None:
    """The study's stated frontier (its line's variants named as `compare --variant` names them); None without."""
    from adaptive_kl.demo.frontier import Frontier

    stated = studies[name].get("frontier")
    if stated is None:
        return None
    return Frontier(**{
        **stated,
        "line": tuple(", ".join(variant.split()) for variant in stated["line"]),
        "secondary": tuple(stated.get("secondary", ())),
    })  # fmt: skip


FRONTIER_PLOT = "frontier.png"
FRONTIERS_PLOT = "frontiers.png"  # a study with `beside`: its frontier and the other's
# Studies begun after `runs.json` recorded provenance: every run they make themselves (not reused) must have it.
RECORDED_STUDIES = ("frontier",)


def provenance_problems(out: str, studies: dict) -> list[str]:
    """What is wrong with the provenance of the finished runs under `out`, one line each (none: all is well): a run
    directory no study's run has; a recorded command that is not the one `execute` gives the run
    (`recorded_command`), or a recorded seed that is not the run's; a run of `RECORDED_STUDIES` made by that study
    with no provenance. A run without provenance is otherwise accepted: it was made before provenance existed."""
    from adaptive_kl.demo.run_files import load_runs

    own = {}  # directory → the run that makes it
    for name in studies:
        seeds = sorted(set(study_seeds(studies, name)) | found_seeds(name, out, studies))
        for run in planned_runs(studies, [name], seeds):
            source = source_run(run, studies)
            own[os.path.normpath(os.path.join(REPOSITORY, source.directory(out)))] = source
    problems = []
    for name in studies:
        root = os.path.join(REPOSITORY, out, name, "runs")
        for variant_dir in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            for entry in sorted(os.listdir(os.path.join(root, variant_dir))):
                directory = os.path.normpath(os.path.join(root, variant_dir, entry))
                if not has_runs(directory):
                    continue
                where = os.path.relpath(directory, REPOSITORY)
                run = own.get(directory)
                if run is None:
                    problems.append(f"{where}: no run of the studies has this directory")
                    continue
                for trained in load_runs(directory):
                    recorded = trained.provenance
                    if not recorded:
                        if run.study in RECORDED_STUDIES:
                            problems.append(f"{where}: no provenance in runs.json (made by `{run.study}`)")
                        continue
                    expected = recorded_command(run, out, studies)
                    if recorded.get("command") != expected:
                        problems.append(f"{where}: recorded command {recorded.get('command')!r}, not {expected!r}")
                    if recorded.get("seed") != run.seed:
                        problems.append(f"{where}: recorded seed {recorded.get('seed')!r}, not {run.seed}")
    return problems


def found_seeds(name: str, out: str, studies: dict) -> set[int]:
    """Seeds with a run directory in the study (so a summary also counts seeds run with another --seeds)."""
    found = set()
    root = os.path.join(REPOSITORY, out, name, "runs")
    for variant_dir in os.listdir(root) if os.path.isdir(root) else []:
        for entry in os.listdir(os.path.join(root, variant_dir)):
            if entry.startswith("seed-") and entry[5:].lstrip("-").isdigit():
                found.add(int(entry[5:]))
    return found


def label(run: Run) -> str:
    """How the log names a run: `frontier: beta=0.02 loss_type=grpo, seed 0`."""
    return f"{run.study}: {run.variant}, seed {run.seed}"


def main(argv: list[str] | None = None, studies: dict | None = None) -> int:
    studies = STUDIES if studies is None else studies
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(studies), help="studies to run (default: all)")
    parser.add_argument(
        "--seeds",
        default=None,
        help=f"seeds of every run (default: each study's own; length 0-4, the rest {DEFAULT_SEEDS})",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each (default 2)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads of each run (default: the cores shared by --jobs)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="VARIANT",
        help="run only these variants of the studies, e.g. 'beta=0 loss_type=grpo' (default: all); the summaries "
        "still cover every finished run",
    )
    parser.add_argument("--summarize", action="store_true", help="only rewrite the summaries from finished runs")
    parser.add_argument(
        "--restart-changed",
        action="store_true",
        help="train again the runs trained with another setup than the runner's command for them (their directories "
        "are moved to <out>/replaced/); without it the runner stops before training, naming the options that differ",
    )
    parser.add_argument(
        "--stop-file",
        metavar="PATH",
        help="start no further run once PATH exists: the runs in flight finish and are summarized, the runner ends "
        "(to free its cores without losing a run's steps since its last checkpoint)",
    )
    parser.add_argument(
        "--out", default=STUDIES_DIR, help="parent directory of the studies (default docs/studies/real)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        seeds = None if args.seeds is None else [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds expects comma-separated integers, got {args.seeds!r}")
    names = args.only or list(studies)
    planned = planned_runs(studies, names, seeds)
    if args.variants:
        known = {variant_key(run.variant): run.variant for run in planned}
        unknown = [v for v in args.variants if variant_key(v) not in known]
        if unknown:
            verb = "is not a variant" if len(unknown) == 1 else "are not variants"
            parser.error(
                f"--variants: {', '.join(map(repr, unknown))} {verb} of {', '.join(names)}; "
                f"allowed: {', '.join(map(repr, dict.fromkeys(known.values())))}"
            )
        wanted = {variant_key(v) for v in args.variants}
        planned = [run for run in planned if variant_key(run.variant) in wanted]
    # A reused variant's run is made (once) in the study it comes from.
    sources = list(dict.fromkeys(source_run(run, studies) for run in planned))
    if args.summarize and args.restart_changed:
        parser.error("--restart-changed trains runs again; --summarize trains none: keep one")
    labelled = [
        (label(run), os.path.join(REPOSITORY, run.directory(args.out)), execute_argv(run, args.out, studies)[3:])
        for run in sources
    ]
    try:  # runs made before runs recorded their command are the studies' own
        reuse_only_own_setups(labelled, os.path.join(REPOSITORY, args.out), args.restart_changed, unrecorded_ok=True)
    except UsageError as error:
        parser.error(str(error))
    codes = []
    if not args.summarize:
        todo = [run for run in sources if not finished(run, args.out)]
        print(f"{len(todo)} runs to do; finished runs are skipped.", flush=True)
        by_label = {label(run): run for run in todo}
        codes = run_sweep(
            [(label(run), execute_argv(run, args.out, studies), os.path.join(REPOSITORY, run.directory(args.out)))
             for run in todo],
            jobs=args.jobs,
            threads=args.threads,
            cwd=REPOSITORY,
            after_each=lambda done: summarize(by_label[done].study, args.out, studies, seeds),
            stop_file=args.stop_file,
            progress=False,  # the log has a line per run
        )  # fmt: skip
        if any(codes):
            print(f"{sum(1 for c in codes if c)} runs failed (see their run.log)", file=sys.stderr)
    for name in names:
        summary = summarize(name, args.out, studies, seeds)
        print(f"{name}: {summary or 'no finished run yet'}")
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
