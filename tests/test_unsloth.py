"""The Unsloth backend against the real Unsloth GRPO trainer, generated on the CPU (see `tests/unsloth_worker.py`).

Each check runs in its own process, because Unsloth must be imported before TRL and patches TRL for the whole process.
CI installs unsloth/unsloth_zoo in its TRL 1.15 environment (the newest TRL Unsloth accepts); elsewhere these tests
skip, saying so.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from tiny import run_python


pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("unsloth") is None or importlib.util.find_spec("unsloth_zoo") is None,
    reason="unsloth is not installed (CI installs it in its TRL 1.15 environment: see .ci/run)",
)

WORKER = os.path.join(os.path.dirname(__file__), "unsloth_worker.py")


def run_check(check: str, model_dir: str, tmp_path) -> None:
    # Unsloth writes its generated trainers under UNSLOTH_COMPILE_LOCATION (default: ./unsloth_compiled_cache), and
    # inductor its compiled code under TORCHINDUCTOR_CACHE_DIR (default: shared by every process of the machine): both
    # private to the check, so that nothing compiled by another run, in another environment, is reused.
    result = run_python(
        WORKER,
        check,
        model_dir,
        UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_compiled_cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        # torch turns its custom-op aliasing warning into an error when `CI` is set, and on a CPU inductor's own
        # `alloc_from_pool`, in Unsloth's compiled causal mask, trips it: keep it the warning users get.
        TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING="0",
    )
    assert f"OK {check}" in result.stdout, result.stdout[-2000:] + result.stderr[-4000:]


def test_wrong_import_order_raises_a_clear_error(tiny_model_dir, tmp_path):
    """Our classes first used on TRL's own, then `import unsloth`: building either says to import Unsloth first."""
    run_check("import_order", tiny_model_dir, tmp_path)


def test_config_keeps_unsloth_init_and_defaults(tiny_model_dir, tmp_path):
    """Every non-KL field equals Unsloth's config's (its own defaults: adamw_8bit, dapo, 5e-5, chunking), through
    the constructor and HfArgumentParser; KL fields validate; dataclasses.replace works."""
    run_check("config", tiny_model_dir, tmp_path)


def test_shim_captures_only_inside_our_loss(tiny_model_dir, tmp_path):
    """The shim is installed once; outside our loss Unsloth gets its β unchanged; inside, β = 0 and the captured
    mask and reference log-probs are the micro-batch's; the capture is closed afterwards."""
    run_check("capture", tiny_model_dir, tmp_path)


def test_hidden_states_branch_matches_and_trains(tiny_model_dir, tmp_path):
    """Unsloth's GPU branch (`UNSLOTH_RETURN_HIDDEN_STATES`: hidden states through its chunked LM head), driven on the
    CPU by a stand-in forward that honours it: exact log-probabilities, parity with Unsloth's β loss, training."""
    run_check("hidden_states", tiny_model_dir, tmp_path)


def test_method_none_matches_unsloth_beta_loss(tiny_model_dir, tmp_path):
    """Loss and every parameter gradient equal Unsloth's own β loss, per loss type (train and eval), with bias
    correction, and where k3 exceeds Unsloth's bound of 10."""
    run_check("parity", tiny_model_dir, tmp_path)


def test_training_through_unsloth_compiled_loss(tiny_model_dir, tmp_path):
    """3 steps each of dynamic+clip and the adaptive controller: β follows the rule, `kl` is ours, nothing is NaN."""
    run_check("train", tiny_model_dir, tmp_path)


def test_unsloth_trainer_on_a_real_llama_model(smollm2_dir, tmp_path):
    """SmolLM2-135M-Instruct through Unsloth's generated GRPO trainer: parity with Unsloth's own β loss in loss and
    every gradient, and a short `dynamic+clip` run. The plain Transformers model stands in for `FastLanguageModel`,
    which loads only on a GPU (as for the tiny model above)."""
    run_check("real_model", smollm2_dir, tmp_path)
