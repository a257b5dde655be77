"""Checks of the Unsloth backend, run in a fresh process: `python tests/unsloth_worker.py CHECK[,CHECK...] MODEL_DIR`.

Unsloth must be imported before TRL, and patches TRL for the whole process, so these checks cannot share the test
session's process. On a CPU, `UNSLOTH_ALLOW_CPU=1` lets `import unsloth` succeed without patching TRL, and
`_patch_trl_rl_trainers("grpo_trainer")` then generates Unsloth's real GRPO trainer module (its compiled loss runs on
inductor's CPU backend). A check raises on failure; the worker prints `OK <check>` for each that passed, and for one
that raised its traceback and `FAILED <check>`, then goes on to the next (each check builds its own trainers) and
exits with 1. `import_order` needs a process of its own: it imports our classes before Unsloth.
"""

from __future__ import annotations

import os
import sys
import traceback


os.environ["UNSLOTH_ALLOW_CPU"] = "1"
sys.path.insert(0, os.path.dirname(__file__))

CHECK, MODEL_DIR = sys.argv[1], sys.argv[2]


def patch_trl_with_unsloth():
    import unsloth  # noqa: F401
    from unsloth.models.rl import _patch_trl_rl_trainers

    _patch_trl_rl_trainers("grpo_trainer")
    import trl

    assert trl.GRPOTrainer.__name__ == "UnslothGRPOTrainer", trl.GRPOTrainer


if CHECK == "import_order":
    # The wrong order: our classes are first used on TRL's own, then Unsloth patches TRL.
    from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer

    patch_trl_with_unsloth()
    for build in (lambda: AdaptiveKLGRPOConfig(output_dir="out", beta=0.1), lambda: AdaptiveKLGRPOTrainer(None, [])):
        try:
            build()
        except ImportError as error:
            assert "import unsloth" in str(error) and "GRPO" in str(error), error
        else:
            raise AssertionError("no ImportError for the wrong import order")
    print("OK import_order")
    sys.exit(0)

import adaptive_kl  # noqa: E402, F401  (the package alone, before Unsloth: its classes are built on first use)


patch_trl_with_unsloth()

import copy  # noqa: E402
import dataclasses  # noqa: E402
import pickle  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import trl  # noqa: E402
from tiny import (  # noqa: E402
    TRAIN_KWARGS,
    fabricated_inputs,
    length_reward,
    loss_and_grads,
    prompt_dataset,
    reference_drift_beta,
)
from tiny import assert_close_to_stock as assert_close  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Qwen2ForCausalLM  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer  # noqa: E402
from adaptive_kl.experimental.binomial import BinomialKLConfig  # noqa: E402
from adaptive_kl.kl.aggregation import LOSS_TYPES  # noqa: E402
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed  # noqa: E402
from adaptive_kl.trainers.unsloth import CapturingEfficientGRPO, capturing_efficient_grpo, install_capture_shim  # noqa: E402


install_cpu_scorer_if_needed()
assert issubclass(AdaptiveKLGRPOTrainer, trl.GRPOTrainer) and issubclass(AdaptiveKLGRPOConfig, trl.GRPOConfig)

BETA = 0.3
# Unsloth's defaults differ from TRL's (e.g. optim and loss_type): the tests set what they compare explicitly.
UNSLOTH_KWARGS = {**TRAIN_KWARGS, "optim": "adamw_torch", "bf16": False, "loss_type": "grpo"}


def unsloth_model(model_cls=AutoModelForCausalLM, dtype=torch.float32):
    """The tiny model with the two methods Unsloth's trainer calls on a `FastLanguageModel` (GPU-only to load)."""
    model = model_cls.from_pretrained(MODEL_DIR, dtype=dtype)
    model.for_training = types.MethodType(lambda self, **kwargs: self.train(), model)
    model.for_inference = types.MethodType(lambda self, **kwargs: self.eval(), model)
    return model


class HiddenStatesQwen2(Qwen2ForCausalLM):
    """A stand-in for the forward Unsloth generates on a GPU: with `UNSLOTH_RETURN_HIDDEN_STATES=1` it returns the
    final hidden states as `.logits`, and says so with the class marker Unsloth's compiler sets. Unsloth's trainer
    then takes the GPU branch: log-probabilities from the hidden states through its chunked LM head."""

    __UNSLOTH_SUPPORTS_RETURN_HIDDEN_STATES__ = True
    hidden_state_calls = 0  # forwards that returned hidden states

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0, **kwargs):
        if os.environ.get("UNSLOTH_RETURN_HIDDEN_STATES") != "1":
            return super().forward(input_ids, attention_mask, position_ids, logits_to_keep=logits_to_keep, **kwargs)
        type(self).hidden_state_calls += 1
        kwargs.pop("labels", None)
        hidden = self.model(input_ids, attention_mask, position_ids, **kwargs).last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) and logits_to_keep else slice(None)
        return CausalLMOutputWithPast(logits=hidden[:, keep])


def make(trainer_cls, config_cls, model_cls=AutoModelForCausalLM, dtype=torch.float32, eval_dataset=None, **kwargs):
    args = config_cls(**{**UNSLOTH_KWARGS, "output_dir": f"{MODEL_DIR}/out-{trainer_cls.__name__}", **kwargs})
    return trainer_cls(
        model=unsloth_model(model_cls, dtype),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=prompt_dataset(),
        eval_dataset=eval_dataset,
        processing_class=AutoTokenizer.from_pretrained(MODEL_DIR),
    )


def unsloth_inputs(trainer, seed=0, drift=0.0):
    """`tiny.fabricated_inputs` as generation leaves them for Unsloth: pad ids after each completion's end (Unsloth
    rebuilds the completion mask from the token ids). `drift` moves two tokens' reference log-prob far enough that
    k3 > 10 there, where Unsloth bounds the estimate."""
    inputs = fabricated_inputs(trainer, seed)
    pad = trainer.processing_class.pad_token_id
    inputs["completion_ids"] = inputs["completion_ids"].masked_fill(inputs["completion_mask"] == 0, pad)
    if drift:
        inputs["ref_per_token_logps"][0, :2] += drift
    return inputs


def check_config():
    """Unsloth's __init__ and defaults survive in our config; the KL fields are validated and round-trip."""
    unsloth_config = trl.GRPOConfig(output_dir="out")
    ours = AdaptiveKLGRPOConfig(output_dir="out")
    kl_fields = {f.name for f in dataclasses.fields(AdaptiveKLGRPOConfig)} - {
        f.name for f in dataclasses.fields(trl.GRPOConfig)
    }
    expected = {k: v for k, v in unsloth_config.to_dict().items() if k not in kl_fields}
    assert {k: v for k, v in ours.to_dict().items() if k not in kl_fields} == expected
    # Unsloth's own defaults, which a generated dataclass __init__ would have replaced by TRL's:
    assert (ours.optim, ours.loss_type, ours.learning_rate, ours.unsloth_num_chunks) == (
        "adamw_8bit",
        "dapo",
        5e-5,
        -1,
    )
    assert ours.kl_adaptation_method == "none" and ours.kl_estimator == "k3"

    config = AdaptiveKLGRPOConfig(output_dir="out", beta=0.1, loss_type="grpo", kl_adaptation_method="dynamic+clip")
    assert (config.beta, config.kl_methods, config.loss_type) == (0.1, ("dynamic", "clip"), "grpo")
    for copied in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):  # training_args.bin is a pickle
        assert type(copied) is AdaptiveKLGRPOConfig and copied.to_dict() == config.to_dict()
    changed = dataclasses.replace(config, steps_per_generation=None, kl_target=0.3)  # TRL refuses both set, as stock
    assert (changed.kl_target, changed.kl_methods, changed.optim) == (0.3, ("dynamic", "clip"), config.optim)
    # Flags: the KL fields parse, and every other field is what the parser gives Unsloth's own config.
    argv = ["--output_dir", "out", "--beta", "0.1", "--use_cpu", "true", "--bf16", "false"]
    (parsed,) = HfArgumentParser(AdaptiveKLGRPOConfig).parse_args_into_dataclasses(
        [*argv, "--kl_adaptation_method", "sigmoid", "--kl_target", "0.2"]
    )
    (parsed_stock,) = HfArgumentParser(trl.GRPOConfig).parse_args_into_dataclasses(argv)
    assert (parsed.kl_methods, parsed.kl_target) == (("sigmoid",), 0.2)
    assert {k: v for k, v in parsed.to_dict().items() if k not in kl_fields} == parsed_stock.to_dict()
    for bad, field in [({"kl_estimator": "k4"}, "kl_estimator"), ({"kl_adaptation_method": "clip+sigmoid"}, "clip")]:
        try:
            AdaptiveKLGRPOConfig(output_dir="out", beta=0.1, **bad)
        except ValueError as error:
            assert field in str(error), error
        else:
            raise AssertionError(f"{bad} accepted")
    try:  # Unsloth's default beta is 0 for dapo: an adaptive method must ask for a positive one
        AdaptiveKLGRPOConfig(output_dir="out", kl_adaptation_method="clip")
    except ValueError as error:
        assert "beta must be > 0" in str(error), error
    else:
        raise AssertionError("beta = 0 accepted with an adaptive method")
    # The KL in the reward hooks TRL's rollout scoring, which Unsloth replaces: refused when the trainer is built.
    try:
        make(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, beta=0.1, kl_placement="reward", kl_estimator="k1")
    except ValueError as error:
        assert "kl_placement='reward' is not supported on Unsloth" in str(error), error
    else:
        raise AssertionError("kl_placement='reward' accepted on Unsloth's trainer")
    try:  # the KL mask is not implemented through Unsloth's own loss: refused when the trainer is built
        make(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, beta=0.1, kl_mask_zero_std_groups=True)
    except ValueError as error:
        assert "kl_mask_zero_std_groups=True is not supported on Unsloth" in str(error), error
    else:
        raise AssertionError("kl_mask_zero_std_groups=True accepted on Unsloth's trainer")
    try:
        BinomialKLConfig(output_dir="out")
    except NotImplementedError as error:
        assert "Unsloth" in str(error), error
    else:
        raise AssertionError("BinomialKLConfig accepted on Unsloth's GRPOConfig")


def check_capture():
    """The shim records apply's arguments only inside our loss, gives Unsloth β = 0 there, and installs once."""
    stock = make(trl.GRPOTrainer, trl.GRPOConfig, beta=BETA)
    ours = make(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, beta=BETA)
    module = sys.modules[trl.GRPOTrainer.__module__]
    shim = module.UnslothEfficientGRPO
    assert isinstance(shim, CapturingEfficientGRPO) and install_capture_shim(module) is shim
    assert module.UnslothEfficientGRPO is shim and not isinstance(shim.original, CapturingEfficientGRPO)

    seen = []
    original_apply = shim.original.apply

    def spy(*args):
        seen.append(args)
        return original_apply(*args)

    shim.original.apply = spy
    inputs = unsloth_inputs(stock)
    loss_and_grads(stock, inputs)
    assert seen[-1][8] == BETA  # outside our loss the shim passes everything through
    captured = {}
    host_kl_inputs = ours._host_kl_inputs

    def probe(capture, *args, **kwargs):
        captured.update(capture["efficient_grpo"])
        return host_kl_inputs(capture, *args, **kwargs)

    ours._host_kl_inputs = probe
    loss_and_grads(ours, inputs)
    assert seen[-1][8] == 0.0 and len(seen) == 2
    assert torch.equal(captured["_mask"].bool(), inputs["completion_mask"].bool())
    assert torch.equal(captured["_ref_logps"], inputs["ref_per_token_logps"])
    assert captured["_new_logps"].requires_grad
    assert captured["extra_kwargs"]["loss_type"] == "grpo"
    assert ours._policy_scorings is None and ours.beta == BETA
    # The shim itself gives Unsloth β = 0 inside a capture, whatever β it is called with.
    args = list(seen[-1])
    args[8] = 0.7
    with capturing_efficient_grpo({}) as capture:
        shim.apply(*args)
    assert seen[-1][8] == 0.0 and capture["efficient_grpo"]["beta"] == 0.7
    shim.original.apply = original_apply


def check_parity(model_cls=AutoModelForCausalLM, loss_types=LOSS_TYPES, bias_cases=("grpo", "dapo"), evaluation=True):
    """Method "none" equals Unsloth's own β loss, in loss and every parameter gradient, per loss type; also with
    bias correction (for `bias_cases`: token level for grpo, sequence level for dapo), where k3 > 10 (Unsloth's
    bound) and, with `evaluation`, in evaluation."""
    # A float64 model: in float32, the two summation orders (β·k added before the host's aggregation, or after) differ
    # by rounding that cancellation in the gradients amplifies past 1e-4 on some CPUs (an AVX-512 Xeon). In float64
    # Unsloth's compiled loss still returns a float32 loss (≤ 1.3e-7 relative measured) and every gradient agrees to
    # < 1e-8, except CISPO's (5.7e-6 measured: part of its compiled path stays float32): tolerances 1e-6, and 1e-5 for
    # CISPO, far below a dropped or misnormalized KL term (> 1e-3, asserted below).
    stock = make(trl.GRPOTrainer, trl.GRPOConfig, model_cls, torch.float64, beta=BETA)
    ours = make(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model_cls, torch.float64, beta=BETA)
    cases = [(loss_type, "sequence" if loss_type == "luspo" else "token", False, 0.0) for loss_type in loss_types]
    levels = {"grpo": "token", "dapo": "sequence"}
    cases += [(loss_type, levels[loss_type], True, 0.0) for loss_type in bias_cases] + [("grpo", "token", False, 12.0)]
    for loss_type, level, bias, drift in cases:
        for trainer in (stock, ours):
            trainer.loss_type = trainer.args.loss_type = loss_type
            trainer.importance_sampling_level = trainer.args.importance_sampling_level = level
            trainer.args.use_bias_correction_kl = bias
        inputs = unsloth_inputs(stock, seed=len(loss_type), drift=drift)
        what = f"{loss_type}/{level}/bias={bias}/drift={drift}"
        rtol = 1e-5 if loss_type == "cispo" else 1e-6
        stock_loss, stock_grads = loss_and_grads(stock, inputs)
        our_loss, our_grads = loss_and_grads(ours, inputs)
        stock.beta = 0.0
        policy_loss, policy_grads = loss_and_grads(stock, inputs)
        eval_policy = loss_and_grads(stock, inputs, train=False)[0] if evaluation else None
        stock.beta = BETA
        assert_close(our_loss, stock_loss, policy_loss, f"{what} loss", rtol)
        assert stock_grads.keys() == our_grads.keys() and stock_grads
        for name in stock_grads:
            assert_close(our_grads[name], stock_grads[name], policy_grads[name], f"{what} {name}", rtol)
        # The comparison sees the KL term: without it the loss is measurably different.
        assert abs(stock_loss - policy_loss) > 1e-3 * abs(stock_loss), what
        if evaluation:
            stock_eval, our_eval = (loss_and_grads(t, inputs, train=False)[0] for t in (stock, ours))
            assert_close(our_eval, stock_eval, eval_policy, f"{what} eval loss", rtol)


def check_train(model_cls=AutoModelForCausalLM, methods=("dynamic+clip", "none", "drift"), steps=3):
    """Training through Unsloth's compiled loss: β follows the rule, our KL metrics are logged, nothing is NaN."""
    settings = {
        "dynamic+clip": {"kl_adaptation_method": "dynamic+clip", "reward_threshold": 0.0},
        "none": {"kl_controller": "adaptive"},
        # The drift after every step, from a target far below it: the error at its clip of 4 at each measurement
        "drift": {"kl_controller": "drift", "target_drift": 1e-6, "drift_every": 1, "beta_max": 1.0},
    }
    for method, extra in [(method, settings[method]) for method in methods]:
        held_out = prompt_dataset(4) if method == "drift" else None
        trainer = make(
            AdaptiveKLGRPOTrainer,
            AdaptiveKLGRPOConfig,
            model_cls,
            eval_dataset=held_out,
            beta=0.04,
            max_steps=steps,
            **extra,
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        logs = [h for h in trainer.state.log_history if "adaptive_kl/raw_kl" in h]
        assert len(logs) == steps, trainer.state.log_history
        for log in logs:
            # Ours, not the 0 Unsloth's loss logs at β = 0: k3's token mean per micro-batch, averaged as TRL logs it
            # (`adaptive_kl/raw_kl` is the step's token mean over its micro-batches)
            assert log["kl"] > 0 and log["adaptive_kl/raw_kl"] > 0, log
            assert all(v == v for v in log.values()), log
        betas = [log["adaptive_kl/current_beta"] for log in logs]
        if method == "dynamic+clip":  # every step's reward ≥ threshold 0: β × 0.9 per step
            assert max(abs(b - 0.04 * 0.9**i) for i, b in enumerate(betas)) < 1e-12, betas
        elif method == "drift":  # measured against the reference after every step: the rule replayed on it
            expected, measured = [0.04], []
            rule = dict(beta=0.04, beta_min=0.0, beta_max=1.0, target_drift=1e-6, max_steps=steps)
            for step, log in enumerate(logs[:-1], 1):
                measured.append((step, log["adaptive_kl/drift"]))
                expected.append(reference_drift_beta(measured, **rule))
            assert betas == pytest.approx(expected, rel=1e-12) and logs[-1]["adaptive_kl/drift"] > 0, (logs, betas)
        else:  # step 1's KL is 0: the controller lowers β, unless every group agreed (then it holds it)
            held = logs[0]["frac_reward_zero_std"] == 1.0
            assert betas[0] == 0.04 and (betas[1] == betas[0]) == held, (betas, held)
        assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def zero_beta_run(skip: bool):
    """4 steps of `dynamic` switching β to 0 at step 3: the log lines, the trained weights and, for each call of
    `_get_per_token_logps_and_entropies`, the optimizer step it served."""
    trainer = make(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        beta=0.1,
        max_steps=4,
        kl_adaptation_method="dynamic",
        beta_min=0.0,
        beta_schedule_steps=3,
        reward_threshold=10.0,
        kl_monitor_steps=0,
        skip_zero_beta_reference=skip,
        seed=0,
    )
    scored = []
    original = trainer._get_per_token_logps_and_entropies

    def counting(model, *args, **kwargs):
        scored.append(trainer.state.global_step + 1)
        return original(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    torch.manual_seed(0)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return logs, weights, scored


def check_zero_beta():
    """On Unsloth's generated trainer the reference forward is skipped from the switch to β = 0 on, as on TRL's, and
    the run is bitwise the one without the skip: the same loss, grad_norm and reward at every step, the same
    weights."""
    (logs, weights, scored), (full_logs, full_weights, full_scored) = zero_beta_run(True), zero_beta_run(False)
    assert [log["adaptive_kl/reference_skipped"] for log in logs] == [0, 0, 1, 1], logs
    for key in ("loss", "grad_norm", "reward"):
        assert [log[key] for log in logs] == [log[key] for log in full_logs], key
    assert all(torch.equal(weights[n], full_weights[n]) for n in weights)
    # the reference's scorings are gone from step 3 on, and only there
    fewer = [full_scored.count(step) - scored.count(step) for step in (1, 2, 3, 4)]
    assert fewer[:2] == [0, 0] and min(fewer[2:]) > 0, (scored, full_scored)


def check_hidden_states():
    """Unsloth's GPU branch, on the CPU: the policy log-probabilities come from hidden states through Unsloth's
    chunked LM head and equal log-softmax of the model's own logits; method "none" keeps parity with Unsloth's β loss
    and trains there."""
    ours = make(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, HiddenStatesQwen2, beta=BETA)
    inputs = unsloth_inputs(ours)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    before = HiddenStatesQwen2.hidden_state_calls
    with torch.no_grad():
        logps, _, _ = ours._get_per_token_logps_and_entropies(ours.model, input_ids, attention_mask, width, 4)
        logits = ours.model(input_ids, attention_mask).logits[:, -width - 1 : -1].float() / ours.temperature
    assert HiddenStatesQwen2.hidden_state_calls > before, "Unsloth did not ask for hidden states"
    assert logits.shape[-1] == ours.model.config.vocab_size  # outside the scoring, the forward gives logits
    expected = logits.log_softmax(-1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    mask = inputs["completion_mask"].bool()
    assert torch.allclose(logps[mask], expected[mask], atol=1e-5), (logps[mask] - expected[mask]).abs().max()
    calls = HiddenStatesQwen2.hidden_state_calls
    check_parity(HiddenStatesQwen2, loss_types=("grpo", "dapo"))
    check_train(HiddenStatesQwen2)
    assert HiddenStatesQwen2.hidden_state_calls > calls


def check_real_model():
    """MODEL_DIR is SmolLM2-135M-Instruct (Llama architecture, BPE, a 49k vocabulary): Unsloth's generated trainer
    keeps parity with its own β loss (one loss type, and past its k3 bound) and trains 2 steps with `dynamic+clip`
    (β's rule needs two). Bias correction and evaluation are left to the tiny model, for CI's time."""
    check_parity(loss_types=("dapo",), bias_cases=(), evaluation=False)
    check_train(methods=("dynamic+clip",), steps=2)


if __name__ == "__main__":
    checks = {"config": check_config, "capture": check_capture, "parity": check_parity, "train": check_train}
    checks["real_model"] = check_real_model
    checks["hidden_states"] = check_hidden_states
    checks["zero_beta"] = check_zero_beta
    failed = False
    for name in CHECK.split(","):
        try:
            checks[name]()
        except Exception:
            traceback.print_exc()
            print(f"FAILED {name}", flush=True)
            failed = True
        else:
            print(f"OK {name}", flush=True)
    sys.exit(1 if failed else 0)
