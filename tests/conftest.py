import os
import sys

import pytest


sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

from tiny import save_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model and character tokenizer saved to disk (TRL builds the reference model from the path)."""
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen2")))

