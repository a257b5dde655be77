"""Every KL field of `AdaptiveKLGRPOConfig` survives each way a config is written and read back.

The paths: a YAML file through `trl.TrlParser`, command-line flags through `transformers.HfArgumentParser`,
`to_dict()` / `to_json_string()`, the `training_args.bin` a trainer saves, and pickle / `copy.deepcopy` /
`dataclasses.replace`. A bad value arriving through each path raises the config's `ValueError`, whose message starts
with the field's name, instead of being accepted.

The KL fields are read off the dataclass (its fields that `GRPOConfig` lacks), so a new field cannot be forgotten.
Two field sets give every one of them (and `beta`) a non-default value between them: `dynamic` refuses a non-fixed
`kl_controller`, so the `dynamic` set keeps `kl_controller="fixed"` and the other uses `"adaptive"`; the `dynamic` set
keeps the reward trigger, which its checkpoint test reads, and the other sets `dynamic_trigger="saturation"`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re

import pytest
import torch
import yaml
from tiny import make_trainer
from transformers import HfArgumentParser
from trl import GRPOConfig, TrlParser

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.embedding import minilm_path


# `kl_estimator="k1"` (used by one field set on purpose) warns at construction; that warning is tested elsewhere.
pytestmark = pytest.mark.filterwarnings("ignore:kl_estimator='k1':UserWarning")

_GRPO_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}
KL_FIELDS = tuple(f.name for f in dataclasses.fields(AdaptiveKLGRPOConfig) if f.name not in _GRPO_FIELDS)
DOCUMENTED_KL_FIELDS = (
    "kl_estimator",
    "kl_adaptation_method",
    "kl_log_ratio_clip",
    "kl_clip_threshold",
    "kl_target",
    "kl_scaling",
    "kl_scaling_rate",
    "dynamic_beta_decay",
    "dynamic_trigger",
    "reward_threshold",
    "saturation_threshold",
    "beta_schedule_steps",
    "kl_controller",
    "target_drift",
    "drift_every",
    "drift_samples",
    "target_kl",
    "kl_horizon",
    "beta_min",
    "beta_max",
    "ref_reset_steps",
    "ref_reset_kl",
    "ref_reset_optimizer",
    "skip_zero_beta_reference",
    "kl_monitor_steps",
    "resume_without_kl_state",
    "kl_placement",
    "kl_mask_zero_std_groups",
    "diversity_metrics",
    "diversity_embedder",
)
CHECKED = (*KL_FIELDS, "beta")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(AdaptiveKLGRPOConfig) if f.name in CHECKED}

DYNAMIC_SET = dict(
    beta=0.2,
    kl_adaptation_method="dynamic+length_normalized",
    kl_clip_threshold=0.5,
    kl_target=0.25,
    dynamic_beta_decay=0.5,
    dynamic_trigger="reward",  # the default: its reward_threshold makes β decay in the first step
    reward_threshold=-1.0,  # every step's mean reward reaches it: β decays in the first step
    saturation_threshold=0.25,
    beta_min=0.01,
    beta_max=0.3,
    beta_schedule_steps=7,
    kl_scaling="sqrt",
    kl_scaling_rate=0.9,
    kl_estimator="k2",
    kl_log_ratio_clip=15.0,  # read by the bias correction (TRL's use_bias_correction_kl, on by default)
    kl_controller="fixed",  # the only controller 'dynamic' accepts
    target_drift=0.3,  # the drift controller's fields, read by neither set (they warn): their values round-trip
    drift_every=3,
    drift_samples=16,
    target_kl=0.02,
    kl_horizon=5000,
    kl_placement="reward",
    kl_mask_zero_std_groups=True,
    ref_reset_steps=25,
    ref_reset_kl=0.5,
    ref_reset_optimizer=True,
    skip_zero_beta_reference=False,
    kl_monitor_steps=5,
    resume_without_kl_state=True,
    diversity_metrics=True,
    diversity_embedder="minilm",
)
CONTROLLER_SET = dict(
    beta=0.15,
    kl_adaptation_method="sigmoid",
    kl_clip_threshold=2.5,
    kl_target=0.3,
    dynamic_beta_decay=0.75,
    dynamic_trigger="saturation",
    reward_threshold=0.5,
    saturation_threshold=0.75,
    beta_min=0.02,
    beta_max=0.45,
    beta_schedule_steps=50,
    kl_scaling="exp",
    kl_scaling_rate=0.95,
    kl_estimator="k1",
    kl_log_ratio_clip=30.0,
    kl_controller="adaptive",
    target_drift=0.25,
    drift_every=7,
    drift_samples=12,
    target_kl=0.03,
    kl_horizon=20000,
    kl_placement="reward",
    kl_mask_zero_std_groups=True,
    ref_reset_steps=3,
    ref_reset_kl=0.2,
    ref_reset_optimizer=True,
    skip_zero_beta_reference=False,
    kl_monitor_steps=0,
    resume_without_kl_state=True,
    diversity_metrics=True,
    diversity_embedder=minilm_path(),  # a sentence-transformers model by its local path
)
FIELD_SETS = pytest.mark.parametrize("values", [DYNAMIC_SET, CONTROLLER_SET], ids=["dynamic", "controller"])

# One out-of-range value per checked field, of the field's own type (so argparse parses it and the config must
# refuse it). Valid in neither field set: beta_min=0.5 exceeds both betas, beta_max=0.01 is below both.
BAD = [
    ("kl_adaptation_method", "clip+sigmoid"),
    ("kl_log_ratio_clip", 100.0),
    ("kl_clip_threshold", 0.0),
    ("kl_monitor_steps", -1),
    ("kl_target", -0.1),
    ("dynamic_beta_decay", 1.5),
    ("reward_threshold", float("nan")),
    ("beta_min", 0.5),
    ("beta_max", 0.01),
    ("beta_schedule_steps", 0),
    ("kl_scaling", "cosine"),
    ("kl_scaling_rate", 1.5),
    ("dynamic_trigger", "entropy"),
    ("saturation_threshold", 0.0),
    ("kl_estimator", "k4"),
    ("kl_controller", "pid"),
    ("target_kl", 0.0),
    ("target_drift", 0.0),
    ("drift_every", 0),
    ("drift_samples", 0),
    ("kl_horizon", 0),
    ("kl_placement", "advantage"),
    ("diversity_embedder", ""),
    ("ref_reset_steps", -1),
    ("ref_reset_kl", -0.5),
    ("beta", -0.1),
]
BAD_VALUES = pytest.mark.parametrize("name,bad", BAD, ids=[name for name, _ in BAD])


def base_kwargs(tmp_path) -> dict:
    return dict(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)


def make_config(tmp_path, values: dict) -> AdaptiveKLGRPOConfig:
    return AdaptiveKLGRPOConfig(**base_kwargs(tmp_path), **values)


def assert_fields(config, values: dict) -> None:
    """Every checked field equals `values`, with the same type (no int for a float, no str for a number)."""
    assert isinstance(config, AdaptiveKLGRPOConfig)
    actual = {name: getattr(config, name) for name in CHECKED}
    assert actual == values
    assert {name: type(v) for name, v in actual.items()} == {name: type(v) for name, v in values.items()}


def assert_names(excinfo, name: str) -> None:
    """The config's message starts with the field's name (`beta` does not match `beta_min ...`)."""
    assert excinfo.type is ValueError
    assert re.match(rf"{re.escape(name)}\b", str(excinfo.value)), str(excinfo.value)


def flags(values: dict) -> list[str]:
    return [item for name, value in values.items() for item in (f"--{name}", str(value))]


def parse_yaml(tmp_path, values: dict, *extra: str) -> AdaptiveKLGRPOConfig:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**base_kwargs(tmp_path), **values}))
    (config,) = TrlParser((AdaptiveKLGRPOConfig,)).parse_args_and_config(args=["--config", str(path), *extra])
    return config


def parse_flags(tmp_path, values: dict) -> AdaptiveKLGRPOConfig:
    args = ["--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu", *flags(values)]
    (config,) = HfArgumentParser(AdaptiveKLGRPOConfig).parse_args_into_dataclasses(args)
    return config


def test_kl_fields_are_read_off_the_dataclass_and_documented():
    """The KL fields (ours minus GRPOConfig's) are non-empty, the documented set, and in the class docstring."""
    assert KL_FIELDS and KL_FIELDS == DOCUMENTED_KL_FIELDS
    params = AdaptiveKLGRPOConfig.__doc__.split("Parameters:")[1]
    assert tuple(re.findall(r"^\s+(\w+) \(`", params, re.M)) == KL_FIELDS
    assert {name for name, _ in BAD} == set(CHECKED) - {
        "diversity_metrics",
        "resume_without_kl_state",
        "ref_reset_optimizer",
        "skip_zero_beta_reference",
        "kl_mask_zero_std_groups",
    }  # bools


def test_field_sets_give_every_field_a_non_default_value(tmp_path):
    """Each set names every KL field and beta, all non-default but the dynamic set's kl_controller and
    dynamic_trigger, and is valid."""
    for values in (DYNAMIC_SET, CONTROLLER_SET):
        assert set(values) == set(CHECKED)
        assert_fields(make_config(tmp_path, values), values)
    assert [n for n in CHECKED if DYNAMIC_SET[n] == DEFAULTS[n]] == ["dynamic_trigger", "kl_controller"]
    assert [n for n in CHECKED if CONTROLLER_SET[n] == DEFAULTS[n]] == []


# --- 1. YAML through trl.TrlParser ---------------------------------------------------------------------------------


@FIELD_SETS
def test_yaml_round_trip(tmp_path, values):
    """A YAML file with every KL field parses through TrlParser into the same values and types."""
    config = parse_yaml(tmp_path, values)
    assert_fields(config, values)
    assert config.kl_methods == tuple(values["kl_adaptation_method"].split("+"))


def test_yaml_value_overridden_by_a_flag(tmp_path):
    """A command-line flag after --config overrides the YAML value; the other YAML values stay."""
    method = "dynamic+length_normalized+clip"
    config = parse_yaml(tmp_path, DYNAMIC_SET, "--kl_clip_threshold", "0.75", "--kl_adaptation_method", method)
    assert_fields(config, {**DYNAMIC_SET, "kl_clip_threshold": 0.75, "kl_adaptation_method": method})
    assert config.kl_methods == ("dynamic", "length_normalized", "clip") and config.kl_transform == "clip"


@BAD_VALUES
def test_yaml_bad_value_raises_naming_the_field(tmp_path, name, bad):
    """A bad value in the YAML file raises the config's ValueError naming the field."""
    with pytest.raises(ValueError) as excinfo:
        parse_yaml(tmp_path, {**DYNAMIC_SET, name: bad})
    assert_names(excinfo, name)


@pytest.mark.parametrize(
    "name,bad", [("beta_schedule_steps", 2.5), ("kl_horizon", 100.0), ("kl_adaptation_method", None)]
)
def test_yaml_values_argparse_does_not_convert_are_still_checked(tmp_path, name, bad):
    """YAML numbers and nulls bypass argparse's type conversion; the config itself refuses a float or null here."""
    with pytest.raises(ValueError) as excinfo:
        parse_yaml(tmp_path, {**DYNAMIC_SET, name: bad})
    assert_names(excinfo, name)


@pytest.mark.parametrize("name", ["beta_schedule_steps", "kl_horizon"])
def test_yaml_boolean_for_an_integer_field_raises(tmp_path, name):
    """A YAML boolean (`true`) for an integer KL field raises rather than becoming 1."""
    with pytest.raises(ValueError) as excinfo:
        parse_yaml(tmp_path, {**DYNAMIC_SET, name: True})
    assert_names(excinfo, name)


def test_unparseable_values_are_refused_by_argparse(tmp_path, capsys):
    """A value argparse cannot convert (YAML string or flag) exits with argparse's error naming the flag."""
    with pytest.raises(SystemExit) as excinfo:
        parse_yaml(tmp_path, {**DYNAMIC_SET, "kl_clip_threshold": "abc"})
    assert excinfo.value.code == 2 and "--kl_clip_threshold" in capsys.readouterr().err
    with pytest.raises(SystemExit) as excinfo:
        parse_flags(tmp_path, {**DYNAMIC_SET, "kl_horizon": "1e4"})
    assert excinfo.value.code == 2 and "--kl_horizon" in capsys.readouterr().err


# --- 2. Command-line flags through transformers.HfArgumentParser ---------------------------------------------------


@FIELD_SETS
def test_flags_round_trip(tmp_path, values):
    """--flag value for every KL field parses into the same values and types."""
    assert_fields(parse_flags(tmp_path, values), values)


def test_clip_flags(tmp_path):
    """`--kl_adaptation_method clip --kl_clip_threshold 0.5` sets the clip transform and its threshold."""
    config = parse_flags(tmp_path, {"beta": 0.1, "kl_adaptation_method": "clip", "kl_clip_threshold": 0.5})
    assert (config.kl_methods, config.kl_transform, config.kl_clip_threshold) == (("clip",), "clip", 0.5)
    untouched = [name for name in KL_FIELDS if name not in ("kl_adaptation_method", "kl_clip_threshold")]
    assert {name: getattr(config, name) for name in untouched} == {name: DEFAULTS[name] for name in untouched}


@BAD_VALUES
def test_flag_bad_value_raises_naming_the_field(tmp_path, name, bad):
    """A bad value given as a flag raises the config's ValueError naming the field."""
    with pytest.raises(ValueError) as excinfo:
        parse_flags(tmp_path, {**DYNAMIC_SET, name: bad})
    assert_names(excinfo, name)


def test_help_lists_every_kl_field(capsys):
    """`--help` lists each KL field's flag with its help text."""
    with pytest.raises(SystemExit) as excinfo:
        HfArgumentParser(AdaptiveKLGRPOConfig).parse_args_into_dataclasses(["--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    squeezed = "".join(text.split())  # argparse re-wraps the help text (and may break after hyphens)
    for f in dataclasses.fields(AdaptiveKLGRPOConfig):
        if f.name in KL_FIELDS:
            metavar = (
                f"[{f.name.upper()}]" if f.type in (bool, "bool") else f.name.upper()
            )  # a bool flag's value is optional
            assert f"--{f.name} {metavar}" in text, f.name
            assert "".join(f.metadata["help"].split()) in squeezed, f.name


# --- 3. to_dict() and to_json_string() -----------------------------------------------------------------------------


@FIELD_SETS
def test_to_dict_and_json_carry_the_kl_fields(tmp_path, values):
    """to_dict() and to_json_string() hold every KL field's value; rebuilding from those entries gives equal fields."""
    config = make_config(tmp_path, values)
    as_dict, as_json = config.to_dict(), json.loads(config.to_json_string())
    assert {name: as_dict[name] for name in CHECKED} == values
    assert {name: as_json[name] for name in CHECKED} == values
    for source in (as_dict, as_json):
        assert_fields(make_config(tmp_path, {name: source[name] for name in CHECKED}), values)


@FIELD_SETS
def test_to_dict_rebuild_from_every_init_field(tmp_path, values):
    """Rebuilding from the whole to_dict() needs two entries dropped; the rest, KL fields included, round-trips.

    to_dict() holds exactly the init fields, but not all round-trip: GRPOConfig.__post_init__ derives
    steps_per_generation and generation_batch_size from each other, and passing both back raises TRL's ValueError
    (stock GRPOConfig does the same, so this is TRL's behaviour, not this package's); hub_token is masked as
    "<HUB_TOKEN>". Other entries __post_init__ transforms (report_to "none" -> [], bf16 None -> True, debug "" -> [],
    accelerator_config -> dict, pad_to_multiple_of "auto" -> None) reach the same values when fed back.
    """
    config = make_config(tmp_path, values)
    as_dict = config.to_dict()
    assert set(as_dict) == {f.name for f in dataclasses.fields(AdaptiveKLGRPOConfig) if f.init}
    with pytest.raises(ValueError, match="'generation_batch_size' and 'steps_per_generation' can not be both"):
        AdaptiveKLGRPOConfig(**as_dict)
    with pytest.raises(ValueError, match="'generation_batch_size' and 'steps_per_generation' can not be both"):
        stock = GRPOConfig(**base_kwargs(tmp_path), beta=values["beta"]).to_dict()
        GRPOConfig(**stock)
    for source in (as_dict, json.loads(config.to_json_string())):
        kept = {k: v for k, v in source.items() if k not in ("steps_per_generation", "hub_token")}
        rebuilt = AdaptiveKLGRPOConfig(**kept)
        assert_fields(rebuilt, values)
        assert rebuilt.to_dict() == as_dict


@BAD_VALUES
def test_to_dict_with_a_bad_value_raises_naming_the_field(tmp_path, name, bad):
    """A to_dict() whose KL entry was edited to a bad value raises the config's ValueError naming the field."""
    as_dict = make_config(tmp_path, DYNAMIC_SET).to_dict()
    as_dict.pop("steps_per_generation")
    with pytest.raises(ValueError) as excinfo:
        AdaptiveKLGRPOConfig(**{**as_dict, name: bad})
    assert_names(excinfo, name)


# --- 4. training_args.bin ------------------------------------------------------------------------------------------


def test_training_args_bin_of_a_checkpoint(tiny_model_dir, tmp_path):
    """The checkpoint's training_args.bin after one step loads as the config with the configured (not run) values."""
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "run"),
        max_steps=1, save_strategy="steps", save_steps=1, **DYNAMIC_SET,
    )  # fmt: skip
    trainer.train()
    # reward_threshold=-1 made β decay in step 1; the run's β lives in the controller, not in the saved config
    assert trainer.beta_controller.beta_base == pytest.approx(DYNAMIC_SET["beta"] * DYNAMIC_SET["dynamic_beta_decay"])
    saved = torch.load(tmp_path / "run" / "checkpoint-1" / "training_args.bin", weights_only=False)
    assert type(saved) is AdaptiveKLGRPOConfig
    assert_fields(saved, DYNAMIC_SET)
    assert_fields(trainer.args, DYNAMIC_SET)


def test_training_args_bin_of_save_model(tiny_model_dir, tmp_path):
    """trainer.save_model writes a training_args.bin that loads as the config with equal KL fields."""
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "run"), **CONTROLLER_SET
    )
    trainer.save_model(str(tmp_path / "saved"))
    saved = torch.load(tmp_path / "saved" / "training_args.bin", weights_only=False)
    assert type(saved) is AdaptiveKLGRPOConfig
    assert_fields(saved, CONTROLLER_SET)
    assert (saved.kl_methods, saved.uses_adaptive_kl) == (("sigmoid",), True)


# --- 5. pickle, copy.deepcopy, dataclasses.replace -----------------------------------------------------------------


@FIELD_SETS
def test_pickle_and_deepcopy_keep_the_fields(tmp_path, values):
    """pickle and copy.deepcopy give an independent config with equal KL fields and working properties."""
    config = make_config(tmp_path, values)
    for copied in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert copied is not config
        assert_fields(copied, values)
        assert (copied.kl_methods, copied.kl_transform, copied.uses_adaptive_kl) == (
            config.kl_methods,
            config.kl_transform,
            config.uses_adaptive_kl,
        )
        copied.kl_target = 9.0
        assert config.kl_target == values["kl_target"]


@FIELD_SETS
def test_replace_keeps_the_fields_and_revalidates(tmp_path, values):
    """dataclasses.replace keeps the KL fields, applies a change, and re-runs validation on a bad value.

    After __post_init__ both steps_per_generation and generation_batch_size are set, and replace() passes both back,
    which TRL refuses (see test_plain_replace_behaves_like_stock_grpo); a replace that changes anything therefore
    also resets steps_per_generation=None, which lets TRL derive it again.
    """
    config = make_config(tmp_path, values)
    same = dataclasses.replace(config, steps_per_generation=None)
    assert_fields(same, values)
    assert same.to_dict() == config.to_dict()
    changed = dataclasses.replace(config, steps_per_generation=None, kl_target=0.4, kl_horizon=30000)
    assert_fields(changed, {**values, "kl_target": 0.4, "kl_horizon": 30000})
    for name, bad in BAD:
        for extra in ({"steps_per_generation": None}, {}):  # KL validation runs before TRL's own checks
            with pytest.raises(ValueError) as excinfo:
                dataclasses.replace(config, **extra, **{name: bad})
            assert_names(excinfo, name)
    if values["kl_controller"] == "fixed":
        with pytest.raises(ValueError, match="both steer beta"):
            dataclasses.replace(config, steps_per_generation=None, kl_controller="stepwise")
    else:
        with pytest.raises(ValueError, match="both steer beta"):
            dataclasses.replace(config, steps_per_generation=None, kl_adaptation_method="dynamic")


def test_plain_replace_behaves_like_stock_grpo(tmp_path):
    """A replace() with only valid changes raises TRL's batch-size ValueError for GRPOConfig and ours alike."""
    ours = make_config(tmp_path, DYNAMIC_SET)
    stock = GRPOConfig(**base_kwargs(tmp_path), beta=DYNAMIC_SET["beta"])
    messages = []
    for config in (ours, stock):
        with pytest.raises(ValueError) as excinfo:
            dataclasses.replace(config, beta=0.3)
        messages.append(str(excinfo.value))
    assert messages[0] == messages[1] and "steps_per_generation" in messages[0]
