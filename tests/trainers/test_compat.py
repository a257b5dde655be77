"""The supported TRL range: declared once, checked at import before TRL is loaded, with what to install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import REPO as ROOT

from adaptive_kl.trainers.hooks import ALLOW_UNSUPPORTED_ENV, SUPPORTED_TRL, check_trl_version


def test_pyproject_declares_the_same_range():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert [d for d in dependencies if d.startswith("trl")] == [f"trl{SUPPORTED_TRL}"]


@pytest.mark.parametrize("version", ["1.15.0", "1.15.2", "1.16.0", "1.16.9"])
def test_supported_versions_pass(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    check_trl_version(version)


@pytest.mark.parametrize("version", ["1.14.3", "1.17.0", "1.17.0.dev0", "2.0.0", "0.29.0"])
def test_unsupported_versions_fail_with_what_to_install(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(ImportError) as excinfo:
        check_trl_version(version)
    message = str(excinfo.value)
    assert f"trl {version} is installed" in message
    assert f"pip install 'trl{SUPPORTED_TRL}'" in message and ALLOW_UNSUPPORTED_ENV in message


def test_override_turns_the_error_into_a_warning(monkeypatch):
    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    with pytest.warns(UserWarning, match=r"trl 1\.17\.0 is installed"):
        check_trl_version("1.17.0")


def test_the_installed_version_is_supported():
    check_trl_version()  # what CI installs must be inside the declared range


def test_import_fails_early_outside_the_range():
    """`import adaptive_kl.trainers.config` with TRL reporting 1.17.0 stops with the range, before TRL is imported."""
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.version\n"
        "m.version = lambda name: '1.17.0' if name == 'trl' else real(name)\n"
        "try:\n"
        "    import adaptive_kl.trainers.config\n"
        "except ImportError as e:\n"
        "    print('ERROR', e, 'trl' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ALLOW_UNSUPPORTED_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300).stdout
    assert out.startswith("ERROR adaptive-kl supports trl>=1.15,<1.17, but trl 1.17.0 is installed")
    assert out.strip().endswith("False")  # TRL was never imported
