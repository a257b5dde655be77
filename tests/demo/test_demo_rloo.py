"""`adaptive-kl demo|compare --trainer rloo`: the same comparison on `AdaptiveKLRLOOTrainer`, and GRPO-only fields
refused before any training."""

from __future__ import annotations

import csv
import json
import warnings

import pytest

from adaptive_kl import AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer
from adaptive_kl.console import main
from adaptive_kl.demo.arguments import DEMO_TRAINERS, TRAINERS, build
from adaptive_kl.demo.runner import TRAINER_DEFAULTS, DemoSettings, make_config
from adaptive_kl.demo.variants import DEMO_METHODS, TRAINER_CLASSES, Variant
from adaptive_kl.trainers.rloo_config import GRPO_ONLY_FIELDS
from adaptive_kl.usage import UsageError


def fails_with(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptive-kl: error:")
    for fragment in fragments:
        assert fragment in err, err
    return err


# --- end to end: two variants trained on RLOO ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rloo_compare(tmp_path_factory):
    """`compare --trainer rloo --quick` in this process, recording every trainer that trains and its config."""
    out = tmp_path_factory.mktemp("rloo-compare")
    trained = []
    train = AdaptiveKLRLOOTrainer.train

    def recording_train(self, *args, **kwargs):
        trained.append((type(self), self.args))
        return train(self, *args, **kwargs)

    argv = ["compare", "--trainer", "rloo", "--kl_adaptation_method", "none,clip", "--quick", "--no-progress",
            "--out", str(out)]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AdaptiveKLRLOOTrainer, "train", recording_train)
        assert main(argv) == 0
    with open(out / "metrics.csv") as f:
        records = list(csv.DictReader(f))
    return out, trained, records


def test_each_variant_trains_an_rloo_trainer(rloo_compare):
    _, trained, _ = rloo_compare
    assert [trainer for trainer, _ in trained] == [AdaptiveKLRLOOTrainer] * 2
    assert [type(args) for _, args in trained] == [AdaptiveKLRLOOConfig] * 2
    assert [args.kl_adaptation_method for _, args in trained] == ["none", "clip"]
    assert all(args.kl_estimator == "k1" and args.beta == TRAINER_DEFAULTS["rloo"]["beta"] for _, args in trained)


def test_the_report_says_rloo_and_records_it(rloo_compare):
    out, _, _ = rloo_compare
    title, _, settings = (out / "summary.md").read_text().splitlines()[:3]
    assert title == "# adaptive-kl compare: kl_adaptation_method on RLOO"
    assert "trainer: RLOO (AdaptiveKLRLOOTrainer)" in settings
    runs = json.loads((out / "runs.json").read_text())
    assert [(run["name"], run["config"]["trainer"]) for run in runs] == [("none", "rloo"), ("clip", "rloo")]


def test_the_adaptive_kl_metrics_are_those_of_the_penalty_in_the_reward(rloo_compare):
    """Every step logs `adaptive_kl/*`; the mean penalty is β · (adapted per-token KL) · (mean length), i.e. β·Σ_t f(k)
    per completion, and without adaptation the raw per-token KL is TRL's own k1 `kl`."""
    _, _, records = rloo_compare
    for method in ("none", "clip"):
        steps = [r for r in records if r["variant"] == method and r["step"] != "0"]
        assert [int(r["step"]) for r in steps] == list(range(1, 7))
        for r in steps:
            beta = float(r["adaptive_kl/current_beta"])
            assert beta == TRAINER_DEFAULTS["rloo"]["beta"]
            expected = beta * float(r["adaptive_kl/adapted_kl"]) * float(r["completions/mean_length"])
            assert float(r["adaptive_kl/reward_penalty"]) == pytest.approx(expected, rel=1e-4, abs=1e-7)
            if method == "none":
                assert float(r["adaptive_kl/raw_kl"]) == pytest.approx(float(r["kl"]), rel=1e-4, abs=1e-7)
    # The policy moves from the reference: the penalty is not zero throughout.
    assert any(float(r["adaptive_kl/reward_penalty"]) != 0 for r in records if r["adaptive_kl/reward_penalty"])


# --- the configs: the demo's five methods on RLOO ----------------------------------------------------------------


def test_the_five_methods_build_rloo_configs_with_the_demos_settings():
    """Each method is a valid `AdaptiveKLRLOOConfig` (k1, RLOO's estimator) that sets nothing its method does not
    read; `dynamic` keeps the demo's threshold and floor."""
    settings = DemoSettings(fixed={"trainer": "rloo"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configs = {m: make_config(Variant(m, {"kl_adaptation_method": m}), settings, "unused") for m in DEMO_METHODS}
    assert [str(w.message) for w in caught if "has no effect" in str(w.message)] == []
    assert all(type(c) is AdaptiveKLRLOOConfig and c.kl_estimator == "k1" for c in configs.values())
    assert configs["dynamic"].reward_threshold == 1.4 and configs["dynamic"].beta_min == 0.004
    assert configs["clip"].kl_clip_threshold == 1.0 and configs["none"].beta_min == 0.0


def test_rloo_takes_its_own_fields_and_grpo_does_not():
    rloo = make_config(Variant("n", {"normalize_advantages": True}), DemoSettings(fixed={"trainer": "rloo"}), "unused")
    assert rloo.normalize_advantages is True
    with pytest.raises(ValueError, match="normalize_advantages is not a field of AdaptiveKLGRPOConfig"):
        make_config(Variant("n", {"normalize_advantages": True}), DemoSettings(), "unused")


# --- the command line ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, field",
    [
        (["compare", "--kl_placement", "loss,reward"], "kl_placement"),
        (["demo", "--set", "kl_placement=reward"], "kl_placement"),
        (["demo", "--set", "diversity_metrics=true"], "diversity_metrics"),
        (["compare", "--beta", "0.1,0.2", "--set", "loss_type=dapo"], "loss_type"),  # TRL's GRPOConfig's own
        (["compare", "--scale_rewards", "group,none"], "scale_rewards"),
    ],
)
def test_a_grpo_only_field_with_rloo_is_a_usage_error(capsys, tmp_path, argv, field):
    """Refused before any training, naming the field and why; the same command on GRPO is valid."""
    argv = [*argv, "--out", str(tmp_path)]
    build(argv)  # GRPO takes the field
    reason = GRPO_ONLY_FIELDS.get(field, "TRL's RLOOConfig has no such field")
    fails_with(capsys, [*argv, "--trainer", "rloo"], f"{field} is GRPO-only ({reason})", "--trainer grpo")


@pytest.mark.parametrize(
    "argv",
    [["demo", "--trainer", "ppo"], ["demo", "--trainer", "binomial_kl"], ["compare", "--trainer", "grpo,ppo"]],
)
def test_an_unknown_trainer_is_refused_by_argparse(capsys, tmp_path, argv):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --trainer: invalid choice" in err and argv[-1].split(",")[-1] in err


def test_the_trainer_option(tmp_path):
    """One trainer runs every variant (and names itself in the title); several are a varied field; GRPO is the
    default."""
    out = ["--out", str(tmp_path)]
    settings, variants, title, _ = build(["demo", "--trainer", "rloo", *out])
    assert settings.fixed == {"trainer": "rloo"} and title == "adaptive-kl demo: the five KL methods on RLOO"
    assert [v.name for v in variants] == list(DEMO_METHODS)
    settings, variants, title, _ = build(["demo", *out])
    assert "trainer" not in settings.fixed and title == "adaptive-kl demo: the five KL methods"
    settings, variants, title, _ = build(["compare", "--trainer", "grpo,rloo", "--beta", "0.1,0.2", *out])
    assert title == "adaptive-kl compare: trainer, beta" and "trainer" not in settings.fixed
    assert [v.overrides for v in variants][1:3] == [{"trainer": "grpo", "beta": 0.2}, {"trainer": "rloo", "beta": 0.1}]
    with pytest.raises(UsageError, match="keep --trainer"):
        build(["compare", "--trainer", "rloo", "--set", "trainer=grpo", "--beta", "0.1,0.2", *out])
    with pytest.raises(UsageError, match="--variant lists whole variants"):
        build(["compare", "--trainer", "grpo,rloo", "--variant", "beta=0", *out])


def test_rloo_is_refused_with_unsloth(tmp_path):
    with pytest.raises(UsageError, match="AdaptiveKLRLOOTrainer does not support Unsloth"):
        build(["demo", "--trainer", "rloo", "--unsloth", "--model", "smollm2", "--out", str(tmp_path)])


def test_the_command_lists_the_trainers_of_the_runner():
    """`arguments` imports no TRL, so it writes the trainers' names out: they are `TRAINER_CLASSES`' own."""
    assert set(TRAINERS) == set(TRAINER_CLASSES) and set(DEMO_TRAINERS) <= set(TRAINERS)
    assert TRAINER_CLASSES["rloo"][1:] == ("AdaptiveKLRLOOConfig", "AdaptiveKLRLOOTrainer")
