"""Config fields: defaults, validation at construction, command-line parsing, and the trainer's argument check."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
from transformers import HfArgumentParser
from trl import GRPOConfig

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer, parse_kl_adaptation_method


NEW_FIELD_DEFAULTS = {
    "kl_adaptation_method": "none",
    "kl_clip_threshold": 1.0,
    "kl_target": 0.1,
    "dynamic_beta_decay": 0.9,
    "dynamic_trigger": "reward",
    "reward_threshold": 0.8,
    "saturation_threshold": 0.5,
    "beta_min": 0.0,
    "beta_max": None,
    "beta_schedule_steps": 1000,
    "kl_scaling": "none",
    "kl_scaling_rate": 0.99,
    "kl_estimator": "k3",
    "kl_controller": "fixed",
    "target_drift": None,
    "drift_every": 5,
    "drift_samples": 32,
    "target_kl": 0.05,
    "kl_horizon": 10000,
    "kl_placement": "loss",
    "kl_mask_zero_std_groups": False,
    "resume_without_kl_state": False,
    "skip_zero_beta_reference": True,
    "kl_monitor_steps": None,
    "diversity_metrics": False,
    "diversity_embedder": "hashed",
    "ref_reset_steps": 0,
    "ref_reset_kl": 0.0,
    "ref_reset_optimizer": False,
    "kl_log_ratio_clip": None,
}


def config(**kwargs):
    return AdaptiveKLGRPOConfig(output_dir="unused", report_to="none", use_cpu=True, **kwargs)


def test_new_fields_defaults_and_help():
    fields = {f.name: f for f in dataclasses.fields(AdaptiveKLGRPOConfig)}
    for name, default in NEW_FIELD_DEFAULTS.items():
        assert fields[name].default == default, name
        assert fields[name].metadata["help"], name
    new = set(fields) - {f.name for f in dataclasses.fields(GRPOConfig)}
    assert new == set(NEW_FIELD_DEFAULTS)


def test_every_grpo_default_is_unchanged():
    ours, stock = config(), GRPOConfig(output_dir="unused", report_to="none", use_cpu=True)
    for f in dataclasses.fields(GRPOConfig):
        assert getattr(ours, f.name) == getattr(stock, f.name), f.name
    assert not ours.uses_adaptive_kl and ours.kl_methods == ()


@pytest.mark.parametrize(
    "value,methods",
    [
        ("none", ()),
        ("clip", ("clip",)),
        ("dynamic+length_normalized", ("dynamic", "length_normalized")),
        ("sigmoid + length_normalized + dynamic", ("sigmoid", "length_normalized", "dynamic")),
    ],
)
def test_method_parsing(value, methods):
    assert parse_kl_adaptation_method(value) == methods
    assert config(beta=0.1, kl_adaptation_method=value).kl_methods == methods


INVALID = [
    (dict(kl_adaptation_method="cliip"), "kl_adaptation_method", "length_normalized"),
    (dict(kl_adaptation_method="clip+sigmoid"), "kl_adaptation_method", "clip/sigmoid"),
    (dict(kl_adaptation_method="clip+clip"), "kl_adaptation_method", "'+'"),
    (dict(kl_adaptation_method="none+dynamic"), "kl_adaptation_method", "none"),
    (dict(kl_adaptation_method=""), "kl_adaptation_method", "dynamic"),
    (dict(kl_adaptation_method="clip+"), "kl_adaptation_method", "dynamic"),
    (dict(kl_clip_threshold=0.0), "kl_clip_threshold", "> 0"),
    (dict(kl_clip_threshold=float("nan")), "kl_clip_threshold", "> 0"),
    (dict(kl_target=-0.1), "kl_target", ">= 0"),
    (dict(kl_target=float("inf")), "kl_target", ">= 0"),
    (dict(dynamic_beta_decay=0.0), "dynamic_beta_decay", "(0, 1]"),
    (dict(dynamic_beta_decay=1.5), "dynamic_beta_decay", "(0, 1]"),
    (dict(reward_threshold=float("nan")), "reward_threshold", "finite"),
    (dict(beta_min=-1e-3), "beta_min", "[0, beta"),
    (dict(beta_min=0.5), "beta_min", "[0, beta"),
    (dict(beta_schedule_steps=0), "beta_schedule_steps", ">= 1"),
    (dict(beta_schedule_steps=2.5), "beta_schedule_steps", "integer"),
    (dict(kl_scaling="cosine"), "kl_scaling", "'linear', 'sqrt', 'log', 'exp'"),
    (dict(kl_scaling="exp", kl_scaling_rate=0.0), "kl_scaling_rate", "(0, 1]"),
    (dict(kl_scaling="exp", kl_scaling_rate=1.01), "kl_scaling_rate", "(0, 1]"),
    (dict(kl_scaling_rate=float("nan")), "kl_scaling_rate", "(0, 1]"),
    (dict(kl_adaptation_method="dynamic", dynamic_trigger="entropy"), "dynamic_trigger", "'reward', 'saturation'"),
    (dict(dynamic_trigger="Reward"), "dynamic_trigger", "'reward', 'saturation'"),
    (dict(saturation_threshold=0.0), "saturation_threshold", "(0, 1]"),
    (dict(saturation_threshold=1.5), "saturation_threshold", "(0, 1]"),
    (dict(saturation_threshold=float("inf")), "saturation_threshold", "(0, 1]"),
    (dict(kl_estimator="k4"), "kl_estimator", "'k1', 'k2', 'k3'"),
    (dict(kl_controller="pid"), "kl_controller", "'fixed', 'adaptive', 'stepwise'"),
    (dict(target_kl=0.0), "target_kl", "> 0"),
    (dict(kl_horizon=0), "kl_horizon", "> 0"),
    (dict(kl_controller="adaptive", kl_horizon=1, per_device_train_batch_size=8), "kl_horizon", "negative"),
    (dict(kl_adaptation_method="dynamic", kl_controller="adaptive"), "kl_controller", "both steer beta"),
    (dict(beta_max=0.05), "beta_max", "a number >= beta, or float('inf')"),
    (dict(beta_max=float("-inf")), "beta_max", "a number >= beta, or float('inf')"),
    (dict(beta_max=float("nan")), "beta_max", "a number >= beta, or float('inf')"),
    (dict(beta_max="1"), "beta_max", "None (the ceiling is beta=0.1)"),
    (dict(beta=float("nan")), "beta", ">= 0"),
    (dict(loss_type="reinforce"), "loss_type", "'dapo'"),
    (dict(ref_reset_steps=-1), "ref_reset_steps", ">= 0"),
    (dict(ref_reset_steps=2.5), "ref_reset_steps", "integer"),
    (dict(ref_reset_kl=float("nan")), "ref_reset_kl", ">= 0"),
    (dict(ref_reset_kl=-0.1), "ref_reset_kl", ">= 0"),
    (dict(ref_reset_optimizer="yes", ref_reset_steps=2), "ref_reset_optimizer", "True or False"),
    (dict(ref_reset_optimizer=True), "ref_reset_optimizer", "ref_reset_steps or ref_reset_kl"),
    (dict(ref_reset_steps=2, beta=0.0), "beta", "beta > 0"),
    (dict(ref_reset_kl=0.1, sync_ref_model=True), "sync_ref_model", "use one of them"),
]


@pytest.mark.parametrize("kwargs,field,allowed", INVALID)
def test_invalid_values_raise_naming_the_field(kwargs, field, allowed):
    kwargs = {"beta": 0.1, **kwargs}
    with pytest.raises(ValueError) as excinfo:
        config(**kwargs)
    message = str(excinfo.value)
    assert field in message and allowed in message


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kl_adaptation_method="clip"),
        dict(kl_scaling="log"),
        dict(kl_estimator="k2"),
        dict(kl_controller="stepwise"),
    ],
)
def test_adaptation_requires_positive_beta(kwargs):
    with pytest.raises(ValueError, match="beta must be > 0"):
        config(beta=0.0, **kwargs)


def test_k1_in_the_loss_warns():
    with pytest.warns(UserWarning, match="zero expected gradient"):
        config(beta=0.1, kl_estimator="k1")


@pytest.mark.parametrize("estimator", ["k1+", "k3+"])
def test_straight_through_estimators_belong_in_the_loss(estimator):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config(beta=0.1, kl_estimator=estimator).uses_adaptive_kl
    assert not [w for w in caught if "zero expected gradient" in str(w.message)]  # k1+ has k2's gradient
    with pytest.raises(
        ValueError, match=rf"kl_estimator='{re.escape(estimator)}' differs from '{estimator[:2]}' only"
    ):
        config(beta=0.1, kl_estimator=estimator, kl_placement="reward")


def test_command_line_flags_parse_into_the_config():
    parser = HfArgumentParser(AdaptiveKLGRPOConfig)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir", "unused", "--report_to", "none", "--use_cpu", "--beta", "0.04",
            "--kl_adaptation_method", "clip+length_normalized", "--kl_clip_threshold", "0.5",
            "--kl_scaling", "sqrt", "--kl_horizon", "500",
        ]
    )  # fmt: skip
    assert (args.kl_methods, args.kl_clip_threshold, args.kl_scaling, args.kl_horizon) == (
        ("clip", "length_normalized"),
        0.5,
        "sqrt",
        500,
    )
    with pytest.raises(ValueError, match="kl_scaling"):
        parser.parse_args_into_dataclasses(["--output_dir", "x", "--beta", "0.1", "--kl_scaling", "cubic"])


def test_to_dict_round_trip():
    original = config(beta=0.1, kl_adaptation_method="sigmoid+dynamic", kl_target=0.2, beta_min=0.01)
    values = original.to_dict()
    assert values["kl_adaptation_method"] == "sigmoid+dynamic" and values["kl_target"] == 0.2
    rebuilt = config(**{name: values[name] for name in NEW_FIELD_DEFAULTS}, beta=0.1)
    assert all(getattr(rebuilt, name) == getattr(original, name) for name in NEW_FIELD_DEFAULTS)


def test_trainer_refuses_a_plain_grpo_config(tiny_model_dir):
    with pytest.raises(TypeError, match="AdaptiveKLGRPOConfig"):
        AdaptiveKLGRPOTrainer(model=tiny_model_dir, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                              args=GRPOConfig(output_dir="unused", report_to="none", use_cpu=True))  # fmt: skip


# A parameter set while nothing reads it: (its field, a value other than the default, the settings that read it).
DRIFT_READER = {"kl_controller": "drift", "target_drift": 0.1, "max_steps": 10}  # (it needs both)
UNREAD_PARAMETERS = [
    ("kl_clip_threshold", 0.5, {"kl_adaptation_method": "clip"}),
    ("kl_target", 0.3, {"kl_adaptation_method": "sigmoid"}),
    ("kl_scaling_rate", 0.9, {"kl_scaling": "exp"}),
    ("dynamic_beta_decay", 0.5, {"kl_adaptation_method": "dynamic"}),
    ("dynamic_trigger", "saturation", {"kl_adaptation_method": "dynamic"}),
    ("reward_threshold", 0.5, {"kl_adaptation_method": "dynamic"}),
    ("saturation_threshold", 0.25, {"kl_adaptation_method": "dynamic", "dynamic_trigger": "saturation"}),
    ("beta_schedule_steps", 50, {"kl_adaptation_method": "dynamic"}),
    ("target_kl", 0.2, {"kl_controller": "stepwise"}),
    ("target_drift", 0.2, DRIFT_READER),
    ("drift_every", 2, DRIFT_READER),
    ("drift_samples", 8, DRIFT_READER),
    ("kl_horizon", 500, {"kl_controller": "adaptive"}),
    ("beta_min", 0.01, {"kl_controller": "stepwise"}),
    ("beta_max", 0.5, {"kl_controller": "stepwise"}),
    ("kl_monitor_steps", 5, {"kl_adaptation_method": "dynamic"}),
    ("resume_without_kl_state", True, {"kl_adaptation_method": "dynamic"}),
]


def unread_warnings(**kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config(**kwargs)
    return [str(w.message) for w in caught if "has no effect" in str(w.message)]


def test_every_parameter_with_a_reader_is_covered():
    from adaptive_kl.trainers.config import PARAMETER_READERS

    covered = [name for name, _, _ in UNREAD_PARAMETERS] + ["kl_log_ratio_clip"]  # read at the defaults: below
    assert covered == list(PARAMETER_READERS)


def test_kl_log_ratio_clip_is_read_where_a_log_ratio_is_exponentiated():
    """Read with k3/k3+ (the default) or the bias correction (TRL's default); set with k1/k2 and no bias correction,
    it warns, naming what would read it; out of (0, 88] or not a number, it is refused naming the field."""
    assert config(beta=0.1, kl_log_ratio_clip=20.0).kl_log_ratio_clip == 20.0
    assert unread_warnings(beta=0.1, kl_log_ratio_clip=20.0, use_bias_correction_kl=False) == []
    assert unread_warnings(beta=0.1, kl_log_ratio_clip=20.0, kl_estimator="k2") == []
    off = dict(kl_estimator="k2", use_bias_correction_kl=False)
    assert unread_warnings(beta=0.1, kl_log_ratio_clip=20.0, **off) == [
        "kl_log_ratio_clip=20.0 has no effect: it is read only with an estimator that exponentiates the log-ratio "
        "(kl_estimator 'k3' or 'k3+') or use_bias_correction_kl=True."
    ]
    for bad in (0.0, -1.0, 89.0, float("inf"), float("nan"), "20"):
        with pytest.raises(ValueError, match=r"kl_log_ratio_clip must be None .* \(0, 88\]"):
            config(beta=0.1, kl_log_ratio_clip=bad)


@pytest.mark.parametrize("name,value,readers", UNREAD_PARAMETERS, ids=[p[0] for p in UNREAD_PARAMETERS])
def test_a_parameter_nothing_reads_warns_naming_what_would_read_it(name, value, readers):
    """Set while its method (or controller) is off: one warning naming the field and what makes it take effect; with
    beta=0 the warning says beta > 0 too; with its reader on, or at its default, none."""
    from adaptive_kl.trainers.config import PARAMETER_READERS

    reader = PARAMETER_READERS[name][1]
    assert unread_warnings(beta=0.1, **{name: value}) == [
        f"{name}={value!r} has no effect: it is read only with {reader}."
    ]
    if name == "beta_min":  # above beta=0 it is refused: beta_min must lie in [0, beta]
        with pytest.raises(ValueError, match=r"beta_min must be a finite number in \[0, beta=0.0\]"):
            config(beta=0.0, beta_min=value)
    else:
        assert unread_warnings(beta=0.0, **{name: value}) == [
            f"{name}={value!r} has no effect: it is read only with beta > 0 and {reader}."
        ]
    assert unread_warnings(beta=0.1, **{**readers, name: value}) == []
    assert unread_warnings(beta=0.1, **readers) == []


def test_kl_target_and_target_kl_point_to_each_other():
    """The sigmoid's centre and the controllers' target: each help says who reads it and names the other."""
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(AdaptiveKLGRPOConfig)}
    assert "sigmoid only" in helps["kl_target"] and "target_kl" in helps["kl_target"]
    assert "kl_controller='adaptive' or 'stepwise' only" in helps["target_kl"] and "kl_target" in helps["target_kl"]


def test_an_infinite_beta_max_is_ziegler_s_unbounded_controller_and_its_help_carries_the_study_s_warning():
    """`beta_max=float("inf")` is accepted (no ceiling, as verl and OpenRLHF run the controller): β rises ×1.5 a step
    past any finite bound while the KL stays above 1.5 × the target; the help says what the study saw it do."""
    from adaptive_kl.kl.controller import BetaController

    unbounded = config(beta=0.1, kl_controller="stepwise", target_kl=0.05, beta_max=float("inf"))
    controller = BetaController.from_args(unbounded)
    for step in range(1, 31):
        controller.update(step, mean_kl=1.0, num_sequences=8)
    assert controller.beta_base == pytest.approx(0.1 * 1.5**30)  # 19,175: no ceiling was applied
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(AdaptiveKLGRPOConfig)}
    assert "float('inf'): no ceiling" in helps["beta_max"]
    assert "lost the format reward on 4 of 5 seeds" in helps["beta_max"]
    assert "lost the format reward on 4 of 5 seeds" in " ".join(AdaptiveKLGRPOConfig.__doc__.split())


def test_an_adaptive_horizon_that_cannot_move_beta_in_the_run_warns_naming_one_that_can():
    """Ziegler's horizon (10,000) with 8 sequences a step moves β by 1.6% at most in 100 steps: a warning with the
    bound and a horizon that moves it 10x in half the run, which does not warn; in a 2-step run, the least horizon the
    config accepts (the formula's, 1, is refused); nor does a run of unknown length warn."""
    adaptive = dict(beta=0.1, kl_controller="adaptive", per_device_train_batch_size=8)
    with pytest.warns(UserWarning) as caught:
        config(max_steps=100, **adaptive)
    (message,) = [str(w.message) for w in caught if "kl_horizon" in str(w.message)]
    assert message == (
        "kl_horizon=10000 with 8 sequences per optimizer step moves beta by at most 1.6% in max_steps=100 steps, "
        "(1 + 0.2 x 8/10000)^100: in this run the 'adaptive' controller is a constant beta. kl_horizon=35 lets it "
        "move beta up to 87.4x in the run."
    )
    # In 2 steps of 8 no accepted horizon (> 0.2 x 8) moves β 10x in one step: the least accepted one is named
    with pytest.warns(UserWarning) as caught:
        config(max_steps=2, **adaptive)
    (message,) = [str(w.message) for w in caught if "kl_horizon" in str(w.message)]
    assert message.endswith("kl_horizon=2 lets it move beta up to 3.24x in the run.")
    for quiet in (dict(max_steps=100, kl_horizon=35), dict(max_steps=2, kl_horizon=2), dict(max_steps=-1)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config(**adaptive, **quiet)
        assert not [w for w in caught if "kl_horizon" in str(w.message)], quiet
