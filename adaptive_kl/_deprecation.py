"""Old import paths of moved modules, kept for one release: importing one warns and gives the module itself."""

from __future__ import annotations

import importlib
import sys
import warnings


# Old dotted path → where the module lives now (moved in 0.2; the old paths go in the release after).
MOVED_MODULES = {
    "adaptive_kl.demo.cli": "adaptive_kl.cli.command",
    "adaptive_kl.demo.grpo_script": "adaptive_kl.cli.grpo",
    "adaptive_kl.demo.usage": "adaptive_kl.cli.usage",
    "adaptive_kl.kl.diversity": "adaptive_kl.metrics.diversity",
}


def alias_moved_module(old: str) -> None:
    """Makes `old` (the importing shim's `__name__`) the module it moved to, with a `DeprecationWarning`: the same
    module object, so attributes set through either name (a test's monkeypatch) are seen by both."""
    new = MOVED_MODULES[old]
    warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in the next release)",
                  DeprecationWarning, stacklevel=2)  # fmt: skip
    sys.modules[old] = importlib.import_module(new)
