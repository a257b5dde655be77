"""Options whose code path would bypass the KL term are refused at init; the others are shown to go through it.

Also: what the controllers do when `sync_ref_model=True` moves the reference, and the warning for a PEFT model
whose trained adapter would be compared against the adapter-disabled base.
"""

from __future__ import annotations

import warnings

import peft
import pytest
import torch
import transformers.trainer
from peft import LoraConfig, get_peft_model
from tiny import TRAIN_KWARGS, fabricated_inputs, length_reward, loss_and_grads, make_trainer, prompt_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.hooks import HOST_INTERNALS, UnsupportedTRLError, check_host


def _config(tmp_path, **kwargs):
    return AdaptiveKLGRPOConfig(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), "beta": 0.1, **kwargs})


# --- Liger and the host's loss path ---------------------------------------------------------------------------------


def test_liger_fused_loss_is_refused_before_loading(tmp_path, monkeypatch):
    """A host that routes `use_liger_kernel=True` to Liger's fused GRPO loss is refused at init, naming the field."""
    monkeypatch.setattr(GRPOTrainer, "_compute_liger_loss", lambda *a, **k: None, raising=False)
    with pytest.raises(ValueError, match="use_liger_kernel=True .* never calls AdaptiveKLGRPOTrainer's loss"):
        AdaptiveKLGRPOTrainer(
            model="/nonexistent/model",  # refused before anything is loaded
            reward_funcs=[length_reward],
            args=_config(tmp_path, use_liger_kernel=True),
            train_dataset=prompt_dataset(),
        )


def test_liger_layer_kernels_keep_our_loss(tiny_model_dir, tmp_path, monkeypatch):
    """On TRL 1.15/1.16 `use_liger_kernel=True` only swaps layer kernels: the loss still goes through our KL term.

    Liger needs a GPU, so its kernel application is replaced by a recorder; what is tested is the trainer's path.
    """
    patched = []
    monkeypatch.setattr(transformers.trainer, "apply_liger_kernel", lambda model, config: patched.append(config))
    assert not hasattr(GRPOTrainer, "_compute_liger_loss")
    common = dict(beta=0.1, use_liger_kernel=True, max_steps=1, output_dir=str(tmp_path / "o"))
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, **common)
    ours = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, **common)
    inputs = fabricated_inputs(stock)
    stock_loss, _ = loss_and_grads(stock, inputs)
    ours_loss, _ = loss_and_grads(ours, inputs)
    assert ours_loss.item() == pytest.approx(stock_loss.item(), rel=1e-6)
    assert ours._log_stats["train"] is not None  # the loss went through our KL term
    ours.train()
    assert patched == [{"fused_linear_cross_entropy": False}]  # Liger applied, its fused loss disabled by TRL
    assert any("adaptive_kl/raw_kl" in h for h in ours.state.log_history)


def test_host_without_the_hooked_methods_is_refused(tmp_path):
    """A GRPOTrainer lacking a hooked method (a TRL outside the range) is refused, naming what is missing."""
    methods = [internal.name for internal in HOST_INTERNALS if internal.kind == "method"]
    old_host = type("GRPOTrainer", (), {"_tag_names": [], **{name: lambda self: None for name in methods[1:]}})
    with pytest.raises(UnsupportedTRLError, match=rf"has no \['{methods[0]}'\].*trl>=1\.15,<1\.17"):
        check_host(old_host, _config(tmp_path), "AdaptiveKLGRPOTrainer", own_loss=True)
    check_host(GRPOTrainer, _config(tmp_path), "AdaptiveKLGRPOTrainer", own_loss=True)  # all there


# --- sync_ref_model -------------------------------------------------------------------------------------------------


def _sync_run(tiny_model_dir, tmp_path, sync: bool):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / f"sync-{sync}"),
        beta=0.1,
        kl_controller="stepwise",
        target_kl=1e-3,
        sync_ref_model=sync,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=1.0,  # the reference becomes the policy at each sync
        bf16=False,
        max_steps=4,
    )
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "adaptive_kl/raw_kl" in h}
    return trainer, logs


def test_controllers_follow_the_kl_to_the_synced_reference(tiny_model_dir, tmp_path):
    """With `sync_ref_model`, the controllers keep their state and see the KL to the reference in use.

    The reference is replaced by the policy after step 2 (alpha 1), so step 3 measures KL 0 and the stepwise
    controller lowers β for step 4 (× 0.75), where the run without sync raises it (× 1.5). β is never reset.
    """
    _, synced = _sync_run(tiny_model_dir, tmp_path, sync=True)
    _, plain = _sync_run(tiny_model_dir, tmp_path, sync=False)
    assert synced[2]["adaptive_kl/raw_kl"] == pytest.approx(plain[2]["adaptive_kl/raw_kl"], rel=1e-6)
    assert synced[2]["adaptive_kl/raw_kl"] > 1.5e-3
    assert synced[3]["adaptive_kl/raw_kl"] < 1e-7 < 1.5e-3 < plain[3]["adaptive_kl/raw_kl"]
    beta = {t: synced[t]["adaptive_kl/current_beta"] for t in synced}
    assert beta[1] == pytest.approx(0.1)
    assert beta[2] == pytest.approx(0.075)  # step 1: KL 0 (policy = reference) → × 0.75
    assert beta[3] == pytest.approx(0.1125)  # step 2: KL above 1.5 × target → × 1.5, kept across the sync
    assert beta[4] == pytest.approx(0.084375)  # step 3: KL 0 to the synced reference → × 0.75
    assert plain[4]["adaptive_kl/current_beta"] == pytest.approx(0.16875)


# --- PEFT model with a trained adapter ------------------------------------------------------------------------------


def _trained_adapter_model(model_dir):
    """A PEFT model whose LoRA adapter already changes the model (lora_B ≠ 0), with `target_parameters`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=2, target_modules=[], target_parameters=["mlp.gate_proj.weight"], init_lora_weights=False)
    return get_peft_model(model, config)


def _build(model, model_dir, tmp_path, peft_config=None):
    return AdaptiveKLGRPOTrainer(
        model=model,
        reward_funcs=[length_reward],
        args=_config(tmp_path, max_steps=1),
        train_dataset=prompt_dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=peft_config,
    )


def test_warns_when_a_trained_adapter_is_compared_with_the_base(tiny_model_dir, tmp_path, monkeypatch):
    """peft < 0.20 with `target_parameters`: TRL scores the reference with the adapter disabled; we warn."""
    monkeypatch.setattr(peft, "__version__", "0.19.0")
    with pytest.warns(UserWarning, match="reference policy is the base model with the adapter disabled"):
        trainer = _build(_trained_adapter_model(tiny_model_dir), tiny_model_dir, tmp_path)
    assert "ref" not in trainer.model.peft_config


@pytest.mark.parametrize("case", ["adapter copied as reference", "fresh adapter from peft_config"])
def test_no_warning_when_the_reference_matches_the_starting_policy(tiny_model_dir, tmp_path, case):
    """TRL copies a trained adapter as the reference; a fresh LoRA starts equal to the base: no warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*adapter disabled.*", category=UserWarning)
        if case == "adapter copied as reference":
            trainer = _build(_trained_adapter_model(tiny_model_dir), tiny_model_dir, tmp_path)
            assert "ref" in trainer.model.peft_config
        else:
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
            trainer = _build(model, tiny_model_dir, tmp_path, LoraConfig(r=2, target_modules=["q_proj"]))
            assert "ref" not in trainer.model.peft_config
    assert any(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters() if "lora_B" in n) == (
        case == "fresh adapter from peft_config"
    )
