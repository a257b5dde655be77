"""Variants of a comparison: named sets of config overrides, parsed and validated from command-line text.

`adaptive-kl compare --kl_scaling none,linear,sqrt,log --set beta=0.1` becomes four variants, each
`AdaptiveKLGRPOConfig` field given as text converted to the field's type. Several varied fields give their product.
`trainer` picks each variant's config and trainer classes (`TRAINER_CLASSES`): GRPO's by default.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import types
import typing
from dataclasses import dataclass, field

from ..experimental.binomial.config import BinomialKLConfig
from ..trainers.config import AdaptiveKLGRPOConfig
from ..trainers.rloo_config import AdaptiveKLRLOOConfig
from .arguments import variant_name


# The five methods of the demo, in the order the tables and plots list them.
DEMO_METHODS = ("none", "clip", "sigmoid", "length_normalized", "dynamic")

# `trainer` (a variant field that is not a config field) → (module, config class, trainer class).
TRAINER_CLASSES = {
    "grpo": ("..trainers.grpo", "AdaptiveKLGRPOConfig", "AdaptiveKLGRPOTrainer"),
    "rloo": ("..trainers.rloo", "AdaptiveKLRLOOConfig", "AdaptiveKLRLOOTrainer"),
    "binomial_kl": ("..experimental.binomial", "BinomialKLConfig", "BinomialKLTrainer"),
}
# How the report names each trainer.
TRAINER_LABELS = {"grpo": "GRPO", "rloo": "RLOO", "binomial_kl": "binomial KL (SPO)"}


@dataclass(frozen=True)
class Variant:
    """One run of a comparison: a display name and the config fields it sets."""

    name: str
    overrides: dict = field(default_factory=dict)


# The configs of the trainers a variant can run (`TRAINER_CLASSES`): the fields a variant can set are theirs.
TRAINER_CONFIGS = (AdaptiveKLGRPOConfig, AdaptiveKLRLOOConfig, BinomialKLConfig)


# Every field a variant can set → its type: those of the trainers' configs, and `trainer` itself.
FIELD_TYPES = {"trainer": typing.Literal[tuple(TRAINER_CLASSES)]} | {
    f.name: hints.get(f.name, str)
    for config_cls, hints in ((config_cls, typing.get_type_hints(config_cls)) for config_cls in TRAINER_CONFIGS)
    for f in dataclasses.fields(config_cls)
    if f.init
}


def _convert(text: str, annotation) -> object:
    """`text` as a value of type `annotation` (bool, int, float, str, or an optional/union of them)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if text.lower() == "none" and type(None) in typing.get_args(annotation) and str not in members:
            return None
        for member in sorted(
            members, key=lambda a: [bool, int, float, str].index(a) if a in (bool, int, float, str) else 4
        ):
            try:
                return _convert(text, member)
            except ValueError:
                continue
        raise ValueError(f"cannot read {text!r} as {annotation}")
    if annotation is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if annotation in (int, float):
        return annotation(text)
    if typing.get_origin(annotation) in (list, dict) or annotation in (list, dict):
        container = typing.get_origin(annotation) or annotation
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, container):
            example = "[1.0, 0.5]" if container is list else '{"key": 1}'
            raise ValueError(f"expected a JSON {container.__name__} such as {example}, got {text!r}")
        return value
    if typing.get_origin(annotation) is typing.Literal:
        if text not in typing.get_args(annotation):
            raise ValueError(f"expected one of {typing.get_args(annotation)}, got {text!r}")
        return text
    return text


def _is_container_field(name: str) -> bool:
    """Whether every type config field `name` accepts (besides None) is a list or dict."""
    annotation = FIELD_TYPES.get(name)
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    return all((typing.get_origin(m) or m) in (list, dict) for m in members if m is not type(None))


def parse_field_value(name: str, text: str) -> object:
    """The value of config field `name` written as `text`; unknown fields and unreadable values raise ValueError."""
    if name not in FIELD_TYPES:
        close = difflib.get_close_matches(name, FIELD_TYPES, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        configs = "/".join(config_cls.__name__ for config_cls in TRAINER_CONFIGS)
        raise ValueError(f"Unknown {configs} field {name!r}.{hint}")
    try:
        return _convert(text, FIELD_TYPES[name])
    except ValueError as error:
        raise ValueError(f"Invalid value for {name}: {error}") from None


def _refuse_duplicates(variants: list[Variant]) -> None:
    """Raises ValueError naming the variants listed more than once (they would share an output directory)."""
    names = [v.name for v in variants]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"Variants {duplicated} are listed more than once")


def variant_grid(varied: dict[str, list[str]]) -> list[Variant]:
    """The product of the varied fields' values, as variants named `field=value, ...` (the value alone for a single
    field whose values are not numbers).

    Args:
        varied: field name → list of values as text, e.g. `{"kl_scaling": ["none", "sqrt"]}`.
    """
    if not varied:
        return [Variant("default")]
    names = list(varied)
    for name in names:
        if _is_container_field(name):
            raise ValueError(f"{name} takes a list or mapping and cannot be varied; set it with --set '{name}=[...]'")
    parsed = [[(text, parse_field_value(name, text)) for text in varied[name]] for name in names]
    variants = []
    for combination in itertools.product(*parsed):
        # A lone field's value names the variant ("sqrt"), unless it is a bare number ("beta=0.01").
        label = ", ".join(
            text if len(names) == 1 and not isinstance(value, (int, float)) else f"{n}={text}"
            for n, (text, value) in zip(names, combination)
        )
        variants.append(Variant(label, {n: value for n, (_, value) in zip(names, combination)}))
    _refuse_duplicates(variants)
    return variants


def listed_variants(specs: list[str], seeds: list[str] | None = None) -> list[Variant]:
    """Variants written out one by one, for comparisons that are not a product of fields: each spec is
    space-separated `FIELD=VALUE` assignments (`"kl_placement=reward kl_estimator=k1"`, or `"beta=0"`), and names its
    variant by them. With several `seeds`, every variant runs once per seed (`..., seed=<s>`).

    Raises:
        ValueError: for an empty spec, an assignment without `=`, a field given twice in one spec, an unknown field or
            value, a list/mapping field, or two specs naming the same variant.
    """
    variants = []
    for spec in specs:
        assignments = spec.split()
        if not assignments:
            raise ValueError("--variant needs FIELD=VALUE assignments, e.g. --variant 'kl_placement=reward beta=0.1'")
        overrides = {}
        for assignment in assignments:
            name, sep, text = assignment.partition("=")
            name = name.replace("-", "_")
            if not sep or not name or not text:
                raise ValueError(f"--variant {spec!r}: expected FIELD=VALUE, got {assignment!r}")
            if name in overrides:
                raise ValueError(f"--variant {spec!r} sets {name} twice")
            if _is_container_field(name):
                raise ValueError(f"{name} takes a list or mapping; set it for every variant with --set '{name}=[...]'")
            overrides[name] = parse_field_value(name, text)
        variants.append(Variant(variant_name(spec), overrides))
    _refuse_duplicates(variants)
    if seeds and len(seeds) > 1:
        variants = [
            Variant(f"{v.name}, seed={s}", {**v.overrides, "seed": parse_field_value("seed", s)})
            for v in variants
            for s in seeds
        ]
    return variants


def method_variants(methods: typing.Iterable[str] = DEMO_METHODS) -> list[Variant]:
    """One variant per `kl_adaptation_method`, named by the method."""
    return variant_grid({"kl_adaptation_method": list(methods)})
