"""Public names that load on first use (PEP 562), for the packages whose `__init__` re-exports them: importing the
package stays cheap (no torch, TRL or `datasets` until a name needs them). Imports nothing of the package, so every
layer may use it (tests/test_layout.py)."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str], namespace: dict):
    """`(__getattr__, __dir__)` for `package`, whose public name → defining submodule (relative) is `exports`; a name
    is imported from its submodule on first use and kept in `namespace` (the package's `globals()`), so that later
    lookups skip `__getattr__`."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
