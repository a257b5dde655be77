"""The Unsloth backend.

First its parts that need no Unsloth: the term on a captured call against Unsloth's formulas re-written here, the
capture shim and source guard on a stand-in generated module, the config `__init__` and the import-order check.

Then the same code against the real Unsloth GRPO trainer, generated on the CPU (see `tests/unsloth_worker.py`). Those
checks run in a process of their own, because Unsloth must be imported before TRL and patches TRL for the whole
process: the tiny model's share one (Unsloth's import, its generated trainer and its compiled loss are made once), the
import-order check and the real model's have one each. CI installs unsloth/unsloth_zoo in its TRL 1.15 environment
(the newest TRL Unsloth accepts); elsewhere they skip, saying so.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch
from repo_paths import REPO, TESTS
from tiny import adapted_kl_term, run_python

from adaptive_kl.kl.aggregation import LOSS_TYPES, TOKEN_SUM_LOSS_TYPES
from adaptive_kl.trainers.unsloth import (
    APPLY_PARAMETERS,
    REQUIRED_SOURCE,
    SUPPORTED_UNSLOTH,
    CapturingEfficientGRPO,
    UnsupportedUnslothError,
    capturing_efficient_grpo,
    check_import_order,
    check_unsloth_source,
    install_capture_shim,
    is_unsloth_class,
    keep_host_init,
    prepare_unsloth_host,
    unsloth_kl_term_inputs,
)


def test_pyproject_extra_declares_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["unsloth"]
    assert extra == [f"unsloth{SUPPORTED_UNSLOTH}", f"unsloth_zoo{SUPPORTED_UNSLOTH}"]


# --- the term on a captured call -------------------------------------------------------------------------------------


def unsloth_beta_term(new, ref, mask, options):
    """The part of Unsloth's `grpo_compute_loss` (unsloth_zoo 2026.10.9) that β multiplies, re-written from its
    source in float64: masked columns zeroed, k3 = expm1(ref − new) − (ref − new) on the clamped log-ratio, bounded
    to ±10, then the loss type's normalizer."""
    keep = mask.bool()
    new, ref = torch.where(keep, new, 0.0).double(), torch.where(keep, ref, 0.0).double()
    x = (ref - new).clamp(-20, 20)
    kl = (torch.expm1(x) - x).clamp(-10, 10)
    m = mask.double()
    loss_type = options["loss_type"]
    gas = options["current_gradient_accumulation_steps"]
    spg = options.get("steps_per_generation")
    if options.get("sample_weight") is not None:
        normalizer = 1.0 / options["num_processes"] * (gas / spg if spg else 1.0)
        return (kl * m * options["sample_weight"].double()[:, None]).sum() / normalizer
    if loss_type in ("grpo", "sapo"):
        return ((kl * m).sum(-1) / m.sum(-1).clamp(min=1)).mean() / gas
    if loss_type == "bnpo":
        return (kl * m).sum() / m.sum().clamp(min=1) / gas
    if loss_type == "dr_grpo":
        return (kl * m).sum() / (kl.size(0) * options["max_completion_length"]) / gas
    if loss_type in ("dapo", "cispo", "vespo"):
        normalizer = max(float(options["num_items_in_batch"]), 1.0) / options["num_processes"]
        return (kl * m).sum() / (normalizer * gas / spg if spg else normalizer)
    assert loss_type == "luspo"
    return (kl * m).sum(-1).mean() / gas


def captured_call(loss_type, *, sample_weight=None, steps_per_generation=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch, width = 5, 7
    lengths = torch.tensor([7, 3, 1, 5, 0])  # one fully masked row (mask_truncated_completions)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    new = torch.randn(batch, width, generator=g) - 2.0
    ref = new + 0.7 * torch.randn(batch, width, generator=g)
    ref[0, 0] = new[0, 0] + 14.0  # k3 ≈ 1.2e6 there: Unsloth's bound of 10 applies
    ref[1, 5] = -math.inf  # a masked column holding anything (Unsloth zeroes masked columns first)
    options = dict(
        loss_type=loss_type,
        current_gradient_accumulation_steps=2,
        steps_per_generation=steps_per_generation,
        num_processes=2,
        num_items_in_batch=torch.tensor(31.0),
        max_completion_length=9,
        importance_sampling_level="token",
        use_bias_correction_kl=False,
        sample_weight=sample_weight,
    )
    call = dict(zip(APPLY_PARAMETERS, (new.requires_grad_(), None, ref, None, None, None, mask, None, 0.04)))
    call["extra_kwargs"] = options
    return call


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("steps_per_generation", [4, None])  # None: evaluation
def test_term_on_a_captured_call_equals_unsloths_beta_part(loss_type, steps_per_generation):
    call = captured_call(loss_type, steps_per_generation=steps_per_generation)
    term, stats = adapted_kl_term(**unsloth_kl_term_inputs(call))
    expected = unsloth_beta_term(call["_new_logps"], call["_ref_logps"], call["_mask"], call["extra_kwargs"])
    assert torch.isfinite(term) and term.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.isfinite(stats).all()
    (grad,) = torch.autograd.grad(term, call["_new_logps"])
    new = call["_new_logps"].detach().double().requires_grad_()
    (expected_grad,) = torch.autograd.grad(
        unsloth_beta_term(new, call["_ref_logps"], call["_mask"], call["extra_kwargs"]), new
    )
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-6 * expected_grad.abs().max().item())
    assert grad[0, 0] == 0  # bounded there: no gradient, as in Unsloth


def test_sample_weights_replace_the_loss_type_normalizer():
    weights = torch.tensor([0.5, 0.0, 2.0, 1.0, 1.0])
    for loss_type in ("grpo", "dapo"):
        call = captured_call(loss_type, sample_weight=weights)
        term, _ = adapted_kl_term(**unsloth_kl_term_inputs(call))
        expected = unsloth_beta_term(call["_new_logps"], call["_ref_logps"], call["_mask"], call["extra_kwargs"])
        assert term.item() == pytest.approx(expected.item(), rel=1e-6)
        unweighted, _ = adapted_kl_term(**unsloth_kl_term_inputs(captured_call(loss_type)))
        assert term.item() != pytest.approx(unweighted.item(), rel=1e-3)


def test_token_sum_normalizer_accepts_a_python_count():
    for loss_type in TOKEN_SUM_LOSS_TYPES:
        call = captured_call(loss_type)
        as_tensor = unsloth_kl_term_inputs(call)["token_normalizer"]
        call["extra_kwargs"]["num_items_in_batch"] = 31
        assert float(unsloth_kl_term_inputs(call)["token_normalizer"]) == pytest.approx(float(as_tensor))
        call["extra_kwargs"]["num_items_in_batch"] = 0  # floored at 1, like Unsloth
        assert unsloth_kl_term_inputs(call)["token_normalizer"] == pytest.approx(1 / 2 * 2 / 4)


def test_rollout_rejection_is_refused():
    call = captured_call("grpo")
    call["extra_kwargs"]["rollout_rs"] = (("token_k3", None, 2.0),)
    with pytest.raises(ValueError, match="UNSLOTH_GRPO_ROLLOUT_RS"):
        unsloth_kl_term_inputs(call)


# --- a stand-in for Unsloth's generated module -----------------------------------------------------------------------


def fragment_lines(function):
    """The code the guard looks for, as comments (the guard matches text; fragments alone are not statements)."""
    return "\n".join(f"    # {fragment}" for name, fragment, _ in REQUIRED_SOURCE if name == function)


GENERATED = f"""
import torch


class UnslothEfficientGRPO(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, {", ".join(APPLY_PARAMETERS[:9])}, scaler=None, n_chunks=1, extra_kwargs=None, upstream_scale=None
    ):
        ctx.mark_non_differentiable()
        return (_new_logps.sum() * 0 + beta,)

    @staticmethod
    def backward(ctx, grad):
        return (None,) * 13


def grpo_compute_loss(ref, new, old, sampling, input_ids, mask, beta, advantages, **kwargs):
{fragment_lines("grpo_compute_loss")}
    return None


def grpo_accumulated_loss(trainer, new, mask):
    return UnslothEfficientGRPO.apply(new, None, None, None, None, None, mask, None, trainer.beta)


class UnslothGRPOTrainer:
    beta = 0.25
"""


def load_generated(tmp_path, source=GENERATED, name="UnslothGRPOTrainer_standin"):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_shim_passes_through_outside_a_capture_and_gives_zero_beta_inside(tmp_path):
    module = load_generated(tmp_path)
    trainer = module.UnslothGRPOTrainer()
    new, mask = torch.zeros(2, 3), torch.ones(2, 3)
    shim = install_capture_shim(module)
    assert install_capture_shim(module) is shim and module.UnslothEfficientGRPO is shim  # idempotent
    assert isinstance(shim, CapturingEfficientGRPO) and shim.forward is shim.original.forward
    assert module.grpo_accumulated_loss(trainer, new, mask)[0].item() == 0.25
    with capturing_efficient_grpo({}) as capture:
        assert module.grpo_accumulated_loss(trainer, new, mask)[0].item() == 0.0
    call = capture["efficient_grpo"]
    assert call["beta"] == 0.25 and call["_new_logps"] is new and call["_mask"] is mask
    assert module.grpo_accumulated_loss(trainer, new, mask)[0].item() == 0.25  # closed again
    with pytest.raises(UnsupportedUnslothError, match="twice"), capturing_efficient_grpo({}):
        module.grpo_accumulated_loss(trainer, new, mask)
        module.grpo_accumulated_loss(trainer, new, mask)
    assert prepare_unsloth_host(type("AdaptiveKLGRPOTrainer", (module.UnslothGRPOTrainer,), {}), "loss") is module
    assert prepare_unsloth_host(object, "loss") is None


@pytest.mark.parametrize("function,fragment,meaning", REQUIRED_SOURCE)
def test_source_guard_names_the_missing_code_and_the_tested_version(tmp_path, function, fragment, meaning):
    check_unsloth_source(load_generated(tmp_path))  # the stand-in has every fragment
    edited = fragment.replace("(", "_v2(", 1) if "(" in fragment else fragment.replace("=", "+=", 1)
    changed = GENERATED.replace(fragment, edited, 1)
    assert changed != GENERATED
    module = load_generated(tmp_path, changed, name=f"changed_{abs(hash(fragment))}")
    with pytest.raises(UnsupportedUnslothError) as error:
        install_capture_shim(module)
    assert SUPPORTED_UNSLOTH in str(error.value) and function in str(error.value)
    assert not isinstance(module.UnslothEfficientGRPO, CapturingEfficientGRPO)  # nothing installed


def test_source_guard_checks_the_apply_signature(tmp_path):
    changed = GENERATED.replace("scaler=None, n_chunks=1", "n_chunks=1, scaler=None")
    with pytest.raises(UnsupportedUnslothError, match="UnslothEfficientGRPO.forward takes"):
        check_unsloth_source(load_generated(tmp_path, changed, name="reordered"))


# --- configuration and import order ----------------------------------------------------------------------------------


@dataclass
class HostConfig:
    """Like Unsloth's generated config: a dataclass whose own __init__ sets defaults the fields do not have."""

    output_dir: str | None = None
    optim: str = "adamw_torch"
    beta: float = 0.0

    def __init__(self, output_dir=None, optim="adamw_8bit", beta=None, **kwargs):
        self.output_dir, self.optim, self.beta = output_dir, optim, 0.001 if beta is None else beta
        self.__post_init__()

    def __post_init__(self):
        pass


@dataclass
class KLConfig(HostConfig):
    kl_target: float = 0.1
    kl_tags: list = field(default_factory=lambda: ["a"])

    def __post_init__(self):
        if self.kl_target <= 0:
            raise ValueError(f"kl_target must be > 0, got {self.kl_target}")
        super().__post_init__()


keep_host_init(KLConfig)


def test_config_keeps_the_host_init_and_sets_its_own_fields_first():
    config = KLConfig("out", kl_target=0.3)
    assert (config.output_dir, config.optim, config.beta, config.kl_target, config.kl_tags) == (
        "out", "adamw_8bit", 0.001, 0.3, ["a"]
    )  # fmt: skip
    assert KLConfig().kl_tags is not KLConfig().kl_tags  # a fresh default per instance
    with pytest.raises(ValueError, match="kl_target"):
        KLConfig(kl_target=0)
    parameters = inspect.signature(KLConfig).parameters
    assert list(parameters)[:3] == ["output_dir", "optim", "beta"] and "kl_target" in parameters
    assert parameters["kl_target"].kind is inspect.Parameter.KEYWORD_ONLY


def test_import_order_check():
    class GRPOTrainer:
        pass

    class UnslothGRPOTrainer(GRPOTrainer):
        pass

    class Patched:
        _unsloth_patched_rl_config = True

    assert is_unsloth_class(UnslothGRPOTrainer) and is_unsloth_class(Patched) and not is_unsloth_class(GRPOTrainer)
    check_import_order(GRPOTrainer, GRPOTrainer, "GRPOTrainer")  # plain TRL
    check_import_order(UnslothGRPOTrainer, UnslothGRPOTrainer, "GRPOTrainer")  # Unsloth imported first
    with pytest.raises(ImportError, match="Put `import unsloth` at the very top"):
        check_import_order(GRPOTrainer, UnslothGRPOTrainer, "GRPOTrainer")


# --- against the real generated trainer ------------------------------------------------------------------------------

needs_unsloth = pytest.mark.skipif(
    importlib.util.find_spec("unsloth") is None or importlib.util.find_spec("unsloth_zoo") is None,
    reason="unsloth is not installed (CI installs it in its TRL 1.15 environment: see .ci/run)",
)

WORKER = os.path.join(TESTS, "unsloth_worker.py")


def run_checks(checks: str, model_dir: str, tmp_path) -> subprocess.CompletedProcess:
    """Runs the worker's `checks` (comma-separated) in one process: its output says `OK <check>` for each that
    passed."""
    # Unsloth writes its generated trainers under UNSLOTH_COMPILE_LOCATION (default: ./unsloth_compiled_cache), and
    # inductor its compiled code under TORCHINDUCTOR_CACHE_DIR (default: shared by every process of the machine): both
    # private to the process, so that nothing compiled by another run, in another environment, is reused.
    return run_python(
        WORKER,
        checks,
        model_dir,
        check=False,  # a failed check is its own test's failure: `assert_passed` shows its output
        UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_compiled_cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        # torch turns its custom-op aliasing warning into an error when `CI` is set, and on a CPU inductor's own
        # `alloc_from_pool`, in Unsloth's compiled causal mask, trips it: keep it the warning users get.
        TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING="0",
    )


def assert_passed(result: subprocess.CompletedProcess, check: str) -> None:
    assert f"OK {check}" in result.stdout.splitlines(), result.stdout[-2000:] + result.stderr[-6000:]


TINY_MODEL_CHECKS = ("config", "capture", "parity", "hidden_states", "train", "zero_beta")


@pytest.fixture(scope="module")
def tiny_model_checks(tiny_model_dir, tmp_path_factory):
    """The worker's run of every check on the tiny model but the import order's, in one process."""
    return run_checks(",".join(TINY_MODEL_CHECKS), tiny_model_dir, tmp_path_factory.mktemp("unsloth"))


@needs_unsloth
def test_wrong_import_order_raises_a_clear_error(tiny_model_dir, tmp_path):
    """Our classes first used on TRL's own, then `import unsloth`: building either says to import Unsloth first."""
    assert_passed(run_checks("import_order", tiny_model_dir, tmp_path), "import_order")


@needs_unsloth
def test_config_keeps_unsloth_init_and_defaults(tiny_model_checks):
    """Every non-KL field equals Unsloth's config's (its own defaults: adamw_8bit, dapo, 5e-5, chunking), through
    the constructor and HfArgumentParser; KL fields validate; dataclasses.replace works."""
    assert_passed(tiny_model_checks, "config")


@needs_unsloth
def test_shim_captures_only_inside_our_loss(tiny_model_checks):
    """The shim is installed once; outside our loss Unsloth gets its β unchanged; inside, β = 0 and the captured
    mask and reference log-probs are the micro-batch's; the capture is closed afterwards."""
    assert_passed(tiny_model_checks, "capture")


@needs_unsloth
def test_hidden_states_branch_matches_and_trains(tiny_model_checks):
    """Unsloth's GPU branch (`UNSLOTH_RETURN_HIDDEN_STATES`: hidden states through its chunked LM head), driven on the
    CPU by a stand-in forward that honours it: exact log-probabilities, parity with Unsloth's β loss, training."""
    assert_passed(tiny_model_checks, "hidden_states")


@needs_unsloth
def test_method_none_matches_unsloth_beta_loss(tiny_model_checks):
    """Loss and every parameter gradient equal Unsloth's own β loss, per loss type (train and eval), with bias
    correction, and where k3 exceeds Unsloth's bound of 10."""
    assert_passed(tiny_model_checks, "parity")


@needs_unsloth
def test_training_through_unsloth_compiled_loss(tiny_model_checks):
    """3 steps each of dynamic+clip and the adaptive controller: β follows the rule, `kl` is ours, nothing is NaN."""
    assert_passed(tiny_model_checks, "train")


@needs_unsloth
def test_unsloth_trainer_on_a_real_llama_model(smollm2_dir, tmp_path):
    """SmolLM2-135M-Instruct through Unsloth's generated GRPO trainer: parity with Unsloth's own β loss in loss and
    every gradient, and a short `dynamic+clip` run. The plain Transformers model stands in for `FastLanguageModel`,
    which loads only on a GPU (as for the tiny model above)."""
    assert_passed(run_checks("real_model", smollm2_dir, tmp_path), "real_model")


@needs_unsloth
def test_zero_beta_skips_the_reference_on_unsloth(tiny_model_checks):
    """From the switch to β = 0 on, Unsloth's generated trainer scores no reference, and the run is bitwise the one
    without the skip (loss, grad_norm, reward, weights)."""
    assert_passed(tiny_model_checks, "zero_beta")
