import os
import sys


# Under pytest-xdist (`-n auto`: one worker a core), one thread a worker, in the commands the tests start too: a
# worker's torch and each subprocess would otherwise spin threads on every core, and the workers slow each other down.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

from adaptive_kl.testing.tiny_model import save_random_model  # noqa: E402
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed  # noqa: E402


SCORER_NOTE = install_cpu_scorer_if_needed()


def pytest_report_header(config):
    import transformers
    import trl

    header = [f"trl {trl.__version__}, transformers {transformers.__version__}"]
    return header + ([SCORER_NOTE] if SCORER_NOTE else [])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model and character tokenizer saved to disk (TRL builds the reference model from the path)."""
    return save_random_model(str(tmp_path_factory.mktemp("tiny-qwen2")))


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a local float32 checkpoint (converted once per machine and Transformers version)."""
    from adaptive_kl.models import MissingModelError, smollm2_path

    try:
        return smollm2_path()
    except MissingModelError as error:
        if os.environ.get("CI"):
            raise  # CI installs it (.ci/run): a missing model there is a broken install, not a reason to skip
        pytest.skip(str(error))
