"""The package's layers, checked: the formula sheet imports torch only, and each layer imports only those below it.

Layers, bottom up: `kl` (pure math) and `metrics` (diversity), torch only, and `models` (where models come from) →
`trainers` (TRL wiring) → `experimental` → `tasks` (the math tasks, their rewards, the named policies) → `usage` (the
command line's shared checks) → `cli` (`adaptive-kl grpo`) and `demo` (`adaptive-kl demo`/`compare`), side by side,
neither importing the other → `console` (the `adaptive-kl` command, which hands each subcommand to its layer).
`testing` is scaffolding for tests and benchmarks: it reaches the host only through the seam (`trainers.hooks`), and
no layer of the package imports it.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import adaptive_kl


PACKAGE_DIR = os.path.dirname(adaptive_kl.__file__)

# Layer → the layers its modules may import from (besides their own).
ALLOWED = {
    "kl": set(),
    "metrics": set(),
    "models": set(),
    "trainers": {"kl", "metrics", "models"},
    "experimental": {"kl", "trainers"},
    "testing": {"trainers"},
    "tasks": {"models", "trainers"},
    "usage": {"models", "tasks"},
    "cli": {"kl", "metrics", "models", "trainers", "experimental", "tasks", "usage"},
    "demo": {"kl", "metrics", "models", "trainers", "experimental", "tasks", "usage"},
    "console": {"cli", "demo"},
}
# Outside the layers: modules every layer may import, which import nothing of the package themselves.
SHARED = {"adaptive_kl._exports"}  # lazy public names (PEP 562) for the packages that re-export
HOST_PACKAGES = ("trl", "transformers", "peft", "accelerate")


def package_modules(layer: str | None = None) -> list[str]:
    """Every module of the package (or of one layer: a package, or a single module such as `console`), by dotted
    name."""
    prefix = "adaptive_kl." + (f"{layer}." if layer else "")
    path = [os.path.join(PACKAGE_DIR, layer)] if layer else [PACKAGE_DIR]
    names = [prefix.rstrip(".")] if layer else []
    return names + [m.name for m in pkgutil.walk_packages(path, prefix)]


def module_file(name: str) -> str:
    relative = name.split(".")[1:]
    base = os.path.join(PACKAGE_DIR, *relative)
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def imported_modules(name: str) -> set[str]:
    """The `adaptive_kl` modules that module `name` imports (anywhere in it: top level or inside functions), resolved
    from relative imports; plus the dynamic imports the demo's variant table names."""
    path = module_file(name)
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "adaptive_kl" or m.startswith("adaptive_kl.")}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_every_module_is_in_a_layer():
    top_level = {m for m in package_modules() if m.count(".") == 1}
    assert top_level == {f"adaptive_kl.{layer}" for layer in ALLOWED} | {"adaptive_kl.__main__"} | SHARED


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer):
    for module in package_modules(layer):
        for target in imported_modules(module):
            if target == "adaptive_kl":
                raise AssertionError(f"{module} imports the package root; import the module that defines the name")
            assert target in SHARED or layer_of(target) in {layer} | ALLOWED[layer], f"{module} imports {target}"


def test_shared_modules_import_nothing_of_the_package():
    assert all(imported_modules(module) == set() for module in SHARED)


def test_library_code_never_imports_testing():
    """`testing/` is scaffolding for tests and benchmarks: no other layer may import it (the table above says so, and
    no module outside it does, `__main__` included)."""
    assert all("testing" not in allowed for layer, allowed in ALLOWED.items() if layer != "testing")
    outside = [m for m in package_modules() if layer_of(m) != "testing"]
    assert [m for m in outside if any(layer_of(t) == "testing" for t in imported_modules(m))] == []


def test_the_command_and_the_demo_stand_side_by_side():
    """`cli` (`adaptive-kl grpo`) and `demo` never import each other: what both use is in `tasks` and `usage` below
    them, and only `console` stands on both."""
    assert "demo" not in ALLOWED["cli"] and "cli" not in ALLOWED["demo"]
    assert [layer for layer, allowed in ALLOWED.items() if {"cli", "demo"} & allowed] == ["console"]


def test_the_import_check_sees_relative_imports():
    """The check above is not vacuous: it resolves the relative imports of a module that has them."""
    assert "adaptive_kl.kl.aggregation" in imported_modules("adaptive_kl.kl.term")
    assert "adaptive_kl.trainers.hooks" in imported_modules("adaptive_kl.experimental.binomial.trainer")
    assert "adaptive_kl.trainers.generation" in imported_modules("adaptive_kl.tasks.evaluation")
    assert "adaptive_kl.tasks.policies" in imported_modules("adaptive_kl.usage")


def fresh_import(modules: list[str]) -> set[str]:
    """The names in `sys.modules` after importing `modules` in a fresh interpreter."""
    code = "import importlib, json, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_formula_sheet_imports_torch_only():
    """Every module of `adaptive_kl.kl` imported in a fresh interpreter: no trl, transformers, peft or accelerate is
    loaded, and nothing of the trainers or the demo."""
    modules = package_modules("kl")
    loaded = fresh_import(modules)
    assert "torch" in loaded and set(modules) <= loaded
    hosts = sorted(m for m in loaded if m.split(".")[0] in HOST_PACKAGES)
    assert hosts == [], hosts
    assert not [m for m in loaded if m.startswith(("adaptive_kl.trainers", "adaptive_kl.demo"))]


def test_library_code_never_imports_the_demo():
    """Every module of the library and of the tasks (`kl`, `trainers`, `experimental`, `tasks`, `usage`) imported
    together in a fresh interpreter: no module of either command (`demo`, `cli`, `console`) or of `testing` is
    loaded."""
    modules = [m for layer in ("kl", "trainers", "experimental", "tasks", "usage") for m in package_modules(layer)]
    loaded = fresh_import(modules)
    assert set(modules) <= loaded
    commands = ("adaptive_kl.demo", "adaptive_kl.cli", "adaptive_kl.console", "adaptive_kl.testing")
    assert not [m for m in loaded if m.startswith(commands)]


@pytest.mark.parametrize(("layer", "other"), [("cli", "adaptive_kl.demo"), ("demo", "adaptive_kl.cli")])
def test_neither_command_loads_the_other(layer, other):
    """Every module of `cli` (or of `demo`) imported in a fresh interpreter: nothing of the other is loaded."""
    modules = package_modules(layer)
    loaded = fresh_import(modules)
    assert set(modules) <= loaded
    assert not [m for m in loaded if m.startswith(other)]


def test_the_package_and_the_command_do_not_import_trl():
    """`import adaptive_kl` and the command's modules leave TRL and Transformers unloaded (`adaptive-kl --unsloth`
    imports Unsloth first, which must come before them)."""
    command = ["adaptive_kl.console", "adaptive_kl.cli.command", "adaptive_kl.demo.command", "adaptive_kl.usage"]
    loaded = fresh_import(["adaptive_kl", "adaptive_kl.demo", "adaptive_kl.cli", "adaptive_kl.tasks", *command])
    assert not {"trl", "transformers", "adaptive_kl.trainers.config"} & loaded


def test_public_names():
    """The top level exports the configs, the trainers, the controller and the callbacks; the experimental classes
    live under their own path and stay importable from the top level."""
    assert adaptive_kl.__all__ == [
        "AdaptiveKLGRPOConfig",
        "AdaptiveKLGRPOTrainer",
        "AdaptiveKLRLOOConfig",
        "AdaptiveKLRLOOTrainer",
        "AdaptiveKLStateCallback",
        "BetaController",
        "HashedNgramEmbedder",
        "KLHealthCallback",
        "RetentionCallback",
        "parse_kl_adaptation_method",
    ]
    from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer

    assert adaptive_kl.BinomialKLTrainer is BinomialKLTrainer and adaptive_kl.BinomialKLConfig is BinomialKLConfig
    for name in adaptive_kl.__all__:
        assert getattr(adaptive_kl, name).__module__.startswith(
            ("adaptive_kl.trainers", "adaptive_kl.kl", "adaptive_kl.metrics")
        ), name


def test_the_kl_package_holds_only_kl_math():
    """`kl/` is the formula sheet: no diversity metric and no path helper live there any more."""
    names = {m.rpartition(".")[2] for m in package_modules("kl")}
    assert names == {
        "kl", "aggregation", "controller", "estimators", "groups", "metrics", "placement", "term", "validation"
    }  # fmt: skip
    import adaptive_kl.kl.validation as validation

    assert not hasattr(validation, "looks_like_local_path")


def test_the_console_entry_point_is_the_dispatcher():
    """`adaptive-kl` runs `adaptive_kl.console:main`, and `python -m adaptive_kl` the same function: its help lists
    every subcommand, the demo's and the training command's."""
    import tomllib

    with open(os.path.join(os.path.dirname(PACKAGE_DIR), "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"adaptive-kl": "adaptive_kl.console:main"}
    assert "adaptive_kl.console" in imported_modules("adaptive_kl.__main__")
    result = subprocess.run(
        [sys.executable, "-m", "adaptive_kl", "--help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: adaptive-kl [-h] {demo,grpo,rloo,compare,frontier} ...")


def test_the_tests_are_laid_out_like_the_package():
    """A test module lives in the folder of the layer it tests (`tests/kl/`, `tests/trainers/`, ...); the top of
    `tests/` holds only the helpers and the checks that cut across layers."""
    tests = os.path.dirname(os.path.abspath(__file__))
    folders = {name for name in os.listdir(tests) if os.path.isdir(os.path.join(tests, name)) and name[0] != "_"}
    assert folders - {"__pycache__"} <= set(ALLOWED), folders
    top_level = sorted(name for name in os.listdir(tests) if name.startswith("test_") and name.endswith(".py"))
    cutting_across = ["test_benchmarks.py", "test_docs.py", "test_errors.py", "test_gpu_check.py", "test_layout.py",
                      "test_notebooks.py"]  # fmt: skip
    assert top_level == sorted(cutting_across), top_level


def test_ci_runs_every_test_that_reads_the_host_on_both_trl_versions():
    """`.ci/run` runs some tests on the newest TRL only (`ONCE`): none of those it leaves out of the TRL 1.15 leg
    imports TRL, but the docs' checks (the docs describe the newest TRL), so a test whose outcome can depend on the
    host's version (the formula sheet against TRL's `nanstd`, ...) runs on both."""
    import re

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, ".ci", "run")) as f:
        once = re.search(r'^ONCE="(.*?)"', f.read(), flags=re.M | re.S)[1]
    left_out = re.findall(r"--ignore=(\S+)", once)
    files = [
        os.path.relpath(path, repo)
        for ignored in left_out
        for path in (
            [os.path.join(repo, ignored)]
            if ignored.endswith(".py")
            else [
                os.path.join(root, name) for root, _, names in os.walk(os.path.join(repo, ignored)) for name in names
            ]
        )
        if os.path.basename(path).startswith("test_") and path.endswith(".py")
    ]
    assert "tests/kl/test_term.py" in files and "tests/metrics/test_diversity.py" in files  # the parse found them
    reading_trl = [
        path
        for path in files
        if re.search(r"^\s*(from|import) trl\b", open(os.path.join(repo, path)).read(), flags=re.M)
    ]
    assert reading_trl == ["tests/test_docs.py"], reading_trl
