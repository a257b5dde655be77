import functools
import glob
import os
import pathlib
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

from repo_paths import REPO  # noqa: E402

from adaptive_kl.testing.tiny_model import save_random_model  # noqa: E402
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed  # noqa: E402


SCORER_NOTE = install_cpu_scorer_if_needed()


# The files whose tests take minutes (the GPU check and Unsloth in fresh processes, the real model, whole commands),
# longest first, then the other files that go to one worker whole (`module_fixture_files`), then the rest: under `-n`
# the workers take the tests in this order as each frees up, so that single short tests fill in behind the long ones
# and the workers end together, where a long test or a whole file started last (test_zero_beta.py, 36 s, is the last
# file pytest collects) would leave the other worker idle. Only the order of the files changes.
SLOW_FILES_FIRST = (
    "tests/test_gpu_check.py",
    "tests/models/test_real_model.py",
    "tests/trainers/test_unsloth.py",
    "tests/demo/test_frontier_command.py",
    "tests/test_benchmarks.py",
    "tests/demo/test_real_studies.py",
    "tests/demo/test_demo.py",
    "tests/test_notebooks.py",
    "tests/trainers/test_multiprocess.py",
)


@functools.cache
def module_fixture_files() -> frozenset[str]:
    """The test files with a module fixture (`scope="module"` in their text), as paths from the repository: each goes
    to one worker whole, since a file split between the workers builds its fixture (up to a minute: a killed and
    resumed sweep, a two-process run) on both."""
    return frozenset(
        pathlib.Path(path).relative_to(REPO).as_posix()
        for path in glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)
        if 'scope="module"' in pathlib.Path(path).read_text()
    )


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}

    def order(item) -> int:
        path = pathlib.Path(item.path).relative_to(REPO).as_posix()
        return rank.get(path, len(rank) + (path not in module_fixture_files()))

    items.sort(key=order)  # stable: within each rank, pytest's order


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without the plugin (`-p no:xdist`) it is never called
def pytest_xdist_make_scheduler(config, log):
    """`-n`'s default distribution (`--dist load`) as a worker frees up, test by test in collection order, but each
    file of `module_fixture_files` as one unit. `LoadScopeScheduling._split_scope` is pytest-xdist's own, not public:
    pyproject.toml's dev extra admits only the versions it was tested on (3.8)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WholeFilesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in module_fixture_files() else nodeid

    config.option.loadscopereorder = False  # the units in collection order, not the largest first
    return WholeFilesScheduling(config, log)


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
