"""The seam with TRL (`adaptive_kl.trainers.hooks`): our trainers take exactly the host's arguments, and a host that
does not behave as the hooks expect fails loudly, naming the installed TRL, even with the unsupported-version
override set, instead of training without the KL term's gradient."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import pathlib
import re

import pytest
import torch
from packaging.version import Version
from repo_paths import REPO
from tiny import TRAIN_KWARGS, fabricated_inputs, length_reward, loss_and_grads, make_trainer, prompt_dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer
from adaptive_kl.trainers.hooks import (
    ALLOW_UNSUPPORTED_ENV,
    SUPPORTED_TRL,
    HostHooks,
    UnsupportedTRLError,
    installed_trl_version,
)
from adaptive_kl.trainers.lifecycle import AdaptiveKLRun


TRAINERS = [
    (GRPOTrainer, GRPOConfig, {}),
    (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, {"beta": 0.1, "kl_adaptation_method": "clip"}),
    (BinomialKLTrainer, BinomialKLConfig, {}),
]
TRAINER_IDS = ["stock", "adaptive", "binomial"]


# --- the host's signature --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer_cls,config_cls,fields", TRAINERS, ids=TRAINER_IDS)
def test_no_reward_source_raises_as_in_trl(tiny_model_dir, tmp_path, trainer_cls, config_cls, fields):
    """TRL's `test_no_reward_source_raises` with each class: `reward_funcs` omitted (it is optional, for
    environment-owned rewards) and no environment gives TRL's own ValueError, not a TypeError from our signature."""
    args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), **fields})
    with pytest.raises(ValueError, match="No reward source provided"):
        trainer_cls(model=tiny_model_dir, args=args, train_dataset=prompt_dataset())


@pytest.mark.parametrize("trainer_cls", [AdaptiveKLGRPOTrainer, BinomialKLTrainer], ids=TRAINER_IDS[1:])
def test_positional_arguments_mean_what_they_mean_for_the_host(tiny_model_dir, tmp_path, trainer_cls):
    """The host's first six parameters passed by position land where the host puts them."""
    config_cls = AdaptiveKLGRPOConfig if trainer_cls is AdaptiveKLGRPOTrainer else BinomialKLConfig
    args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path)})
    train, evaluation = prompt_dataset(8), prompt_dataset(4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = trainer_cls(tiny_model_dir, [length_reward], args, train, evaluation, tokenizer)
    assert trainer.reward_funcs == [length_reward] and trainer.args is args
    assert trainer.train_dataset is train and trainer.eval_dataset is evaluation
    assert trainer.processing_class is tokenizer


def test_the_documented_signature_is_the_hosts_plus_ours():
    """`help(AdaptiveKLGRPOTrainer)` shows the host's parameters, in order, with their defaults, then ours."""
    import inspect

    host = list(inspect.signature(GRPOTrainer.__init__).parameters.values())
    ours = list(inspect.signature(AdaptiveKLGRPOTrainer.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(host)]] == [(p.name, p.kind, p.default) for p in host]
    assert [(p.name, p.kind) for p in ours[len(host) :]] == [("diversity_embedder", inspect.Parameter.KEYWORD_ONLY)]


# --- the policy scoring captured from the host's loss ----------------------------------------------------------------


@pytest.fixture
def ours(tiny_model_dir, tmp_path):
    return make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, output_dir=str(tmp_path / "ours")
    )


@pytest.fixture
def unsupported_version(monkeypatch):
    """A TRL release outside the range, with the override that lets it be imported."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.17.0" if name == "trl" else real(name))
    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    return "1.17.0"


def assert_names_the_version(error: pytest.ExceptionInfo, version: str) -> None:
    message = str(error.value)
    assert f"trl {version}" in message and f"trl{SUPPORTED_TRL}" in message, message
    assert ALLOW_UNSUPPORTED_ENV in message


def detached_scoring(monkeypatch):
    """A host whose policy scoring carries no gradient (e.g. computed under no_grad)."""
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def scoring(self, *args, **kwargs):
        logps, *rest = original(self, *args, **kwargs)
        return (logps.detach(), *rest)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)


def test_captured_log_probabilities_without_gradient_are_refused(ours, monkeypatch, unsupported_version):
    """In training, a captured scoring without gradient would add a KL term that does not regularize: refused, naming
    the installed TRL, although the unsupported-version override is set."""
    inputs = fabricated_inputs(ours)
    detached_scoring(monkeypatch)
    with pytest.raises(UnsupportedTRLError, match=r"carry no gradient") as error:
        loss_and_grads(ours, inputs)
    assert_names_the_version(error, unsupported_version)


def test_evaluation_needs_no_gradient(ours, monkeypatch):
    """Evaluation scores without gradient: the same host is accepted there, and the loss is that of a sound host."""
    inputs = fabricated_inputs(ours)
    expected, _ = loss_and_grads(ours, inputs, train=False)
    detached_scoring(monkeypatch)
    loss, _ = loss_and_grads(ours, inputs, train=False)
    assert loss.item() == expected.item()


@pytest.mark.parametrize("scorings", [0, 2])
def test_a_loss_must_score_the_policy_exactly_once(ours, monkeypatch, unsupported_version, scorings):
    """A host loss that scores the policy twice (which one carries the loss's gradient?) or never (the KL term would
    have nothing to share) is refused, in training and in evaluation."""
    inputs = fabricated_inputs(ours)
    original = GRPOTrainer._compute_loss

    def host_loss(self, model, batch):
        if scorings == 0:  # log-probabilities computed without the hooked method
            self._policy_scorings, hidden = None, self._policy_scorings
            try:
                return original(self, model, batch)
            finally:
                self._policy_scorings = hidden
        original(self, model, batch)
        return original(self, model, batch)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", host_loss)
    for train in (True, False):
        with pytest.raises(UnsupportedTRLError, match=f"exactly once .* did {scorings} times") as error:
            loss_and_grads(ours, inputs, train=train)
        assert_names_the_version(error, unsupported_version)


def test_one_scoring_with_gradient_passes(ours):
    """The installed TRL's loss scores the policy once, with gradient: the check lets it through, and closes."""
    loss, grads = loss_and_grads(ours, fabricated_inputs(ours))
    assert torch.isfinite(loss) and grads
    assert ours._policy_scorings is None and ours.beta == 0.1


# --- the rewards captured while a batch is scored --------------------------------------------------------------------


@pytest.mark.parametrize("trainer_cls,config_cls,fields", TRAINERS[1:], ids=TRAINER_IDS[1:])
def test_scoring_without_calculate_rewards_is_refused(tiny_model_dir, tmp_path, monkeypatch, trainer_cls, config_cls,
                                                      fields):  # fmt: skip
    """A host that scores a generation batch without `_calculate_rewards` would leave the trainers with the rewards of
    an earlier batch (a frozen `dynamic` β, stale binomial advantages): refused at the first batch."""
    trainer = make_trainer(trainer_cls, config_cls, tiny_model_dir, output_dir=str(tmp_path), max_steps=1, **fields)
    original = GRPOTrainer._generate_and_score_completions

    def without_rewards(self, inputs):
        calculate = type(self)._calculate_rewards
        self._calculate_rewards = lambda *args: GRPOTrainer._calculate_rewards(self, *args)  # bypasses the hook
        try:
            return original(self, inputs)
        finally:
            del self._calculate_rewards
            assert type(self)._calculate_rewards is calculate

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", without_rewards)
    with pytest.raises(UnsupportedTRLError, match="could not capture the rewards"):
        trainer.train()


# --- one seam: every undocumented name of the host the package uses is in one table, checked at construction ------

SEAM_MODULES = (
    "adaptive_kl/trainers/hooks/__init__.py",
    "adaptive_kl/trainers/hooks/internals.py",
    "adaptive_kl/trainers/unsloth.py",
)  # the two tables, which name what they list
HOST_HOLDERS = {"trainer", "host", "callback"}  # variables and parameters that hold a host object (or `x.trainer`)
# What TRL and Transformers document as public API of a trainer and of its callbacks: any module may use it.
DOCUMENTED = {
    "args", "model", "accelerator", "state", "control", "processing_class", "train_dataset", "eval_dataset",
    "callback_handler", "add_callback", "remove_callback", "pop_callback", "train", "evaluate", "predict", "log",
    "compute_loss", "training_step", "save_model", "push_to_hub", "create_model_card", "end", "is_world_process_zero",
    "is_in_train",
}  # fmt: skip


# Accesses that the owners of these modules still have to move to the seam's accessors: module → names of the table.
def host_names() -> set[str]:
    """Every name the host defines or sets: the methods and class attributes of `trl.GRPOTrainer`'s MRO (TRL's
    trainers, `transformers.Trainer`) and of `transformers.ProgressCallback`, and each `self.<name> = ...` in their
    modules."""
    from transformers.trainer_callback import ProgressCallback

    names = set()
    for cls in [*GRPOTrainer.__mro__[:-1], *ProgressCallback.__mro__[:-1]]:
        names |= {name for name in vars(cls) if not name.startswith("__")}
        source = inspect.getsource(inspect.getmodule(cls))
        names |= set(re.findall(r"self\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)", source))
    return names


def own_names(trees: list[ast.AST]) -> set[str]:
    """The names the package defines on its classes: methods, class attributes, and each `self.<name> = ...`."""
    names = set()
    for tree in trees:
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for item in cls.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                for target in item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
            for node in ast.walk(cls):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(element, ast.Attribute) and is_name(element.value, "self"):
                            names.add(element.attr)
    return names


def is_name(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


HOST_MIXINS = ("HostHooks", "AdaptiveKLRun")  # the package's bases of its trainers, placed before the host's


def is_host_class(cls: ast.ClassDef) -> bool:
    """A subclass of the host trainer, or a mixin of the package's trainers: it is one of `HOST_MIXINS`, or one of its
    bases is named `...Trainer` or is one of them."""
    bases = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in cls.bases]
    return cls.name in HOST_MIXINS or any(base.endswith("Trainer") or base in HOST_MIXINS for base in bases)


def holds_host(node: ast.AST) -> bool:
    """`trainer`, `host`, `callback`, or `<anything>.trainer`."""
    return is_name(node, *HOST_HOLDERS) or (isinstance(node, ast.Attribute) and node.attr == "trainer")


def seam_violations(source: str, host: set[str], own: set[str], in_seam: bool = False) -> list[tuple[str, str]]:
    """`(name, where)` for each use in `source` of a host name that is not documented API: `self.<name>` in a subclass
    of the host, `<holder>.<name>` on a variable or parameter that holds a host object, `getattr`/`hasattr`/`setattr`/
    `delattr(<holder>, "<name>")`, and a method or class attribute of a subclass of the host that overrides one.
    A name is undocumented when it is not in `DOCUMENTED` and either the host has it or the package does not define it
    (a name of unknown origin). `getattr(<holder>, "<name>", default)` is flagged whatever the name, and in the seam
    too (`in_seam`: only that rule applies): a missing host attribute must fail at construction, not fall back."""
    found = []

    def undocumented(name: str) -> bool:
        return not name.startswith("__") and name not in DOCUMENTED and (name in host or name not in own)

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and is_name(node.func, "getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and holds_host(node.args[0])
        ):
            name = node.args[1].value
            if node.func.id == "getattr" and len(node.args) == 3:
                found.append((name, f"line {node.lineno}: {ast.unparse(node)} (a silent fallback)"))
            elif not in_seam and undocumented(name):
                found.append((name, f"line {node.lineno}: {ast.unparse(node)}"))
    if in_seam:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and holds_host(node.value) and undocumented(node.attr):
            found.append((node.attr, f"line {node.lineno}: {ast.unparse(node)}"))
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and is_host_class(node)):
        for item in cls.body:
            targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            defined = [item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            for name in defined + [target.id for target in targets if isinstance(target, ast.Name)]:
                if name in host and undocumented(name):
                    found.append((name, f"line {item.lineno}: {cls.name} overrides {name}"))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and is_name(node.value, "self") and undocumented(node.attr):
                found.append((node.attr, f"line {node.lineno}: self.{node.attr} in {cls.name}"))
    return found


@pytest.fixture(scope="module")
def package_sources() -> dict[str, str]:
    root = pathlib.Path(REPO)
    return {str(path.relative_to(root)): path.read_text() for path in sorted((root / "adaptive_kl").rglob("*.py"))}


@pytest.fixture(scope="module")
def names(package_sources) -> tuple[set[str], set[str]]:
    """The host's names, and the package's own (those of the host it sets excepted: they stay the host's)."""
    host = host_names()
    return host, own_names([ast.parse(source) for source in package_sources.values()]) - host


def test_every_undocumented_name_of_the_host_the_package_uses_is_in_the_table(package_sources, names):
    """Every name of TRL's and Transformers' trainers (and of their `ProgressCallback`) that the package uses and that
    they do not document is in `hooks.HOST_INTERNALS`, which checks each at construction; no module reads one with a
    default (`getattr(trainer, name, None)`), the tables included."""
    from adaptive_kl.trainers.hooks import HOST_INTERNALS

    table = {internal.name for internal in HOST_INTERNALS}
    unlisted, fallbacks = {}, {}
    for path, source in package_sources.items():
        for name, where in seam_violations(source, *names, in_seam=path in SEAM_MODULES):
            if "silent fallback" in where:
                fallbacks.setdefault(path, []).append(where)
            elif name not in table:
                unlisted.setdefault(path, []).append(where)
    assert not unlisted, f"host names missing from hooks.HOST_INTERNALS: {unlisted}"
    assert not fallbacks, f"a missing host attribute must fail at construction (check_host_attributes): {fallbacks}"


def test_the_seam_check_fails_on_a_direct_access_to_the_host(names):
    """The source check itself: each way of reaching an undocumented host name outside the seam is caught, and the
    package's own names and the host's documented API are not."""
    host, own = names
    assert {"loss_type", "scale_rewards", "current_gradient_accumulation_steps", "_metrics", "_tag_names"} <= host
    caught = seam_violations(
        "class T(HostHooks, GRPOTrainer):\n"
        "    _tag_names = ['x']\n"
        "    def _load_from_checkpoint(self, checkpoint, model=None):\n"
        "        self._metrics['train']['a'].append(self.beta)\n"
        "    def compute_loss(self, model, inputs):\n"
        "        return self.loss_type\n"
        "def f(trainer):\n"
        "    trainer._logs.clear()\n"
        "    steps = getattr(trainer, 'current_gradient_accumulation_steps', None) or 1\n"
        "    return getattr(trainer, 'scale_rewards', None), trainer.num_generations_eval, steps\n"
        "class Recorder:\n"
        "    def on_step_end(self):\n"
        "        return self.trainer.reward_weights, hasattr(self.trainer, 'temperature')\n",
        host,
        own,
    )
    assert {name for name, _ in caught} == {
        "_tag_names", "_load_from_checkpoint", "_metrics", "beta", "loss_type", "_logs", "scale_rewards",
        "current_gradient_accumulation_steps", "num_generations_eval", "reward_weights", "temperature",
    }, caught  # fmt: skip
    assert [where for _, where in caught if "silent fallback" in where] == [
        "line 9: getattr(trainer, 'current_gradient_accumulation_steps', None) (a silent fallback)",
        "line 10: getattr(trainer, 'scale_rewards', None) (a silent fallback)",
    ]
    own_use = (
        "class T(HostHooks, GRPOTrainer):\n"
        "    def compute_loss(self, model, inputs):\n"
        "        self._step_stats = 1\n"
        "        return self.beta_controller, self.args.loss_type, self.accelerator, self.callback_handler\n"
        "def f(trainer):\n"
        "    trainer.add_callback(None)\n"
        "    return trainer.state.global_step, trainer.kl_monitor\n"
    )
    assert not seam_violations(own_use, host, own | {"_step_stats"})
    # In the seam only the fallback is refused; elsewhere a name nobody defines is refused too.
    assert seam_violations("x = trainer._metrics\ny = getattr(trainer, '_logs', None)\n", host, own, in_seam=True) == [
        ("_logs", "line 2: getattr(trainer, '_logs', None) (a silent fallback)")
    ]
    assert seam_violations("x = trainer.no_such_name\n", host, own) == [
        ("no_such_name", "line 1: trainer.no_such_name")
    ]


def test_the_design_lists_every_private_name_the_package_uses():
    """docs/design.md §9's table of private names is `HOST_INTERNALS`' private entries, no more, no fewer, with the
    counts it states, which `scripts/code_counts.py` prints from the checkout."""
    from adaptive_kl.trainers.hooks import HOST_INTERNALS

    design = pathlib.Path(REPO, "docs", "design.md").read_text()
    listed = set(re.findall(r"^  \| `(_\w+)` \|", design, flags=re.MULTILINE))
    private = [entry for entry in HOST_INTERNALS if entry.name.startswith("_")]
    assert listed == {entry.name for entry in private}
    by_library = {
        library: sum(entry.owner.split(".")[0] == library for entry in private)
        for library in ("trl", "transformers", "accelerate")
    }
    bases = {**vars(HostHooks), **vars(AdaptiveKLRun)}  # what the package's trainers override, in their two bases
    overridden = [entry for entry in private if entry.kind == "method" and entry.name in bases]
    assert (
        f"{len(private)} private names ({by_library['trl']} TRL, {by_library['transformers']} Transformers, "
        f"{by_library['accelerate']} Accelerate) and {len(overridden)} overridden private methods"
    ) in " ".join(design.split())


def test_the_table_holds_every_internal_of_the_installed_host(tiny_model_dir, tmp_path):
    """Each entry exists in the installed TRL, Transformers and Accelerate, where its kind says: methods and class
    attributes on the class, attributes on a built trainer, training attributes in the host's source, callback
    attributes on a `ProgressCallback`, accelerator attributes on an `Accelerator`, module attributes in their module
    (TRL 1.15's fused scorer only there)."""
    import importlib

    import accelerate
    from transformers.trainer_callback import ProgressCallback

    from adaptive_kl.trainers.hooks import HOST_INTERNALS, INTERNAL_KINDS, assigned_in_host_source, host_internals

    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, output_dir=str(tmp_path)
    )
    owners = {
        "method": GRPOTrainer,
        "class attribute": GRPOTrainer,
        "attribute": trainer,
        "accelerator attribute": accelerate.Accelerator(cpu=True),
        "callback attribute": ProgressCallback(),
    }
    assert {internal.kind for internal in HOST_INTERNALS} <= set(INTERNAL_KINDS) | {"module attribute"}
    for internal in host_internals("grpo"):  # RLOO's own entries: tests/trainers/test_rloo.py
        assert internal.use and internal.owner, internal
        if internal.kind == "training attribute":
            assert assigned_in_host_source(GRPOTrainer, internal.name), internal
        elif internal.kind == "module attribute":
            module = importlib.import_module(internal.owner)
            assert hasattr(module, internal.name) or Version(installed_trl_version()) >= Version("1.16"), internal
        else:
            assert hasattr(owners[internal.kind], internal.name), internal


def test_a_host_whose_training_loop_sets_no_attribute_of_the_table_fails_at_construction(monkeypatch):
    """A training attribute (set by the host's training loop, so a new trainer lacks it) is checked in the host's
    source before any model is loaded: a host that no longer sets it is refused, naming it."""
    from adaptive_kl.trainers.hooks import internals

    renamed = internals.HostInternal(
        "renamed_accumulation_steps", "transformers.Trainer", ("grpo", "rloo"), "training attribute", "a test"
    )
    monkeypatch.setattr(internals, "HOST_INTERNALS", (*internals.HOST_INTERNALS, renamed))
    args = AdaptiveKLGRPOConfig(**{**TRAIN_KWARGS, "beta": 0.1})
    with pytest.raises(UnsupportedTRLError, match=r"has no \['renamed_accumulation_steps'\]"):
        internals.check_host(GRPOTrainer, "grpo", args, "AdaptiveKLGRPOTrainer", own_loss=True)
    monkeypatch.setattr(internals, "HOST_INTERNALS", internals.HOST_INTERNALS[:-1])
    internals.check_host(GRPOTrainer, "grpo", args, "AdaptiveKLGRPOTrainer", own_loss=True)


@pytest.mark.parametrize("name", ["_load_from_checkpoint", "_load_callback_state", "_prepare_inputs", "_tag_names"])
def test_a_host_without_a_method_of_the_table_fails_at_construction(tiny_model_dir, tmp_path, monkeypatch, name):
    """A TRL that renamed one of the host's methods or class attributes is refused before any model is loaded,
    naming it, instead of failing deep inside training (e.g. at the first checkpoint)."""
    for cls in GRPOTrainer.__mro__[:-1]:
        if name in vars(cls):
            monkeypatch.delattr(cls, name)
    for trainer_cls, config_cls, fields in TRAINERS[1:]:
        args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), **fields})
        with pytest.raises(UnsupportedTRLError, match=rf"has no \['{name}'\]"):
            trainer_cls(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=prompt_dataset())


@pytest.mark.parametrize(
    "name", ["_metrics", "_logs", "_buffered_inputs", "beta", "ref_model", "_models", "loss_type", "is_fsdp_enabled"]
)
def test_a_host_that_sets_no_attribute_of_the_table_fails_at_construction(tiny_model_dir, tmp_path, monkeypatch,
                                                                          name):  # fmt: skip
    """A TRL whose `__init__` no longer sets an attribute of the table (or an Accelerate whose `Accelerator` no
    longer keeps `_models`) is refused at construction, naming it."""
    original = GRPOTrainer.__init__

    def without(self, *args, **kwargs):
        original(self, *args, **kwargs)
        delattr(self.accelerator if name == "_models" else self, name)

    monkeypatch.setattr(GRPOTrainer, "__init__", without)
    for trainer_cls, config_cls, fields in TRAINERS[1:]:
        args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), **fields})
        with pytest.raises(UnsupportedTRLError, match=rf"set no \['{name}'\]"):
            trainer_cls(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=prompt_dataset())


def test_model_card_tags_are_the_hosts_and_ours():
    assert AdaptiveKLGRPOTrainer._tag_names == [*GRPOTrainer._tag_names, "adaptive-kl"]
    assert BinomialKLTrainer._tag_names == [*GRPOTrainer._tag_names, "binomial-kl"]
