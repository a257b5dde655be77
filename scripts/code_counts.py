"""The counts docs/design.md reports of the seam and the code's granularity, read off the checkout this script is in.

    python scripts/code_counts.py            # prints them
    python scripts/code_counts.py --trace    # also the package's files one GRPO step runs code from (tiny model, CPU)

- host names: the entries of `HOST_INTERNALS` (what TRL, Transformers and Accelerate do not document as public),
  and of them the private ones (a leading underscore), by library;
- overridden private methods: the host's private methods a class of the package defines again;
- lines: of the package, and of `trainers/` and `kl/`;
- small functions: functions and methods whose body (after its docstring) is at most 5 lines, and those whose body
  is a single `return`;
- with `--trace`: the package's files that run code during one GRPO optimizer step at the defaults and with an
  adaptation (`sys.settrace` over a tiny model's `train()`).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import Counter


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
PACKAGE = os.path.join(REPOSITORY, "adaptive_kl")


def package_files() -> list[str]:
    return sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(PACKAGE) for name in names if name.endswith(".py")
    )


def host_names() -> tuple[int, Counter]:
    """`(entries, private ones by library)` of `HOST_INTERNALS`."""
    from adaptive_kl.trainers.hooks.internals import HOST_INTERNALS

    private = Counter(entry.owner.split(".")[0] for entry in HOST_INTERNALS if entry.name.startswith("_"))
    return len(HOST_INTERNALS), private


def overridden_private_methods() -> list[str]:
    """`Class.method` for each private method of the host (`HOST_INTERNALS`, kind "method") a package class
    defines."""
    from adaptive_kl.trainers.hooks.internals import HOST_INTERNALS

    private = {entry.name for entry in HOST_INTERNALS if entry.kind == "method" and entry.name.startswith("_")}
    found = []
    for path in package_files():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found += [f"{node.name}.{item.name}" for item in node.body
                          if isinstance(item, ast.FunctionDef) and item.name in private]  # fmt: skip
    return sorted(found)


def small_functions() -> tuple[int, int, int]:
    """`(functions, bodies of at most 5 lines, bodies that are a single return)` over the package."""
    total = small = single_return = 0
    for path in package_files():
        for node in ast.walk(ast.parse(open(path).read())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            if not body:
                continue
            total += 1
            lines = body[-1].end_lineno - body[0].lineno + 1
            small += lines <= 5
            single_return += len(body) == 1 and isinstance(body[0], ast.Return)
    return total, small, single_return


def files_one_step_runs(**fields) -> list[str]:
    """The package's files that run code during `train()` of one optimizer step on the tiny model (after the
    trainer is built), relative to the package."""
    import tempfile

    from datasets import Dataset

    from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
    from adaptive_kl.testing.tiny_model import save_random_model

    model = save_random_model(tempfile.mkdtemp())
    args = AdaptiveKLGRPOConfig(
        output_dir=tempfile.mkdtemp(), beta=0.04, max_steps=1, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, report_to="none", save_strategy="no", use_cpu=True, bf16=False, **fields,
    )  # fmt: skip
    trainer = AdaptiveKLGRPOTrainer(
        model, lambda completions, **kwargs: [float(len(c)) for c in completions], args,
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(8)]}),
    )  # fmt: skip
    seen = set()

    def trace(frame, event, arg):
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE):
            seen.add(os.path.relpath(path, PACKAGE))
        return None

    sys.settrace(trace)
    try:
        trainer.train()
    finally:
        sys.settrace(None)
    return sorted(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="store_true", help="also trace one GRPO step's files (builds a tiny model)")
    args = parser.parse_args(argv)
    entries, private = host_names()
    overridden = overridden_private_methods()
    total, small, single_return = small_functions()
    lines = {}
    for path in package_files():
        part = os.path.relpath(path, PACKAGE).split(os.sep)[0]
        with open(path) as f:
            count = f.read().count("\n")
        lines["adaptive_kl/"] = lines.get("adaptive_kl/", 0) + count
        if part in ("trainers", "kl"):
            lines[f"{part}/"] = lines.get(f"{part}/", 0) + count
    by_library = ", ".join(f"{n} {library}" for library, n in private.most_common())
    print(f"host names: {entries}; private: {sum(private.values())} ({by_library})")
    print(f"overridden private methods: {len(overridden)} ({', '.join(overridden)})")
    print("lines: " + "; ".join(f"{part} {count:,}" for part, count in lines.items()))
    print(
        f"functions: {total}; bodies of at most 5 lines: {small} ({100 * small / total:.0f}%); a single return: "
        f"{single_return}"
    )
    if args.trace:
        for label, fields in (("defaults", {}), ("adapting (kl_scaling=log)", {"kl_scaling": "log"})):
            files = files_one_step_runs(**fields)
            print(f"files one GRPO step runs code from, {label}: {len(files)} ({', '.join(files)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
