"""The seam with TRL (`adaptive_kl.trainers.hooks`): our trainers take exactly the host's arguments, and a host that
does not behave as the hooks expect fails loudly, naming the installed TRL, even with the unsupported-version
override set, instead of training without the KL term's gradient."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from repo_paths import REPO
from tiny import TRAIN_KWARGS, fabricated_inputs, length_reward, loss_and_grads, make_trainer, prompt_dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer
from adaptive_kl.trainers.hooks import ALLOW_UNSUPPORTED_ENV, SUPPORTED_TRL, UnsupportedTRLError


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


# --- one table of the host's internals -------------------------------------------------------------------------------

SEAM_MODULES = ("adaptive_kl/trainers/hooks.py", "adaptive_kl/trainers/unsloth.py")  # the two tables
TRAINER_NAMES = {"trainer", "host", "GRPOTrainer", "Trainer"}  # names that hold a host trainer or its class


def host_private_names() -> set[str]:
    """Every private name the host classes define or set on themselves: the methods and class attributes of
    `trl.GRPOTrainer` and its bases (TRL's `_BaseTrainer`, `transformers.Trainer`), and each `self._name = ...` in
    their modules' source."""
    import inspect
    import re

    names = set()
    for cls in GRPOTrainer.__mro__[:-1]:
        names |= {name for name in vars(cls) if name.startswith("_") and not name.startswith("__")}
        names |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]+)?=", inspect.getsource(inspect.getmodule(cls))))
    return names


def seam_violations(source: str, private: set[str]) -> list[str]:
    """Where `source` names a private attribute of the host outside the seam: an override or class attribute in a
    subclass of the host, `self.<name>` inside one (and `self.beta`, TRL's β), `<trainer>.<name>` anywhere, and
    `getattr(x, "<name>", ...)`."""
    import ast

    found = []

    def flag(node, what):
        found.append(f"line {node.lineno}: {what}")

    tree = ast.parse(source)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in cls.bases}
        if not bases & {"HostHooks", "GRPOTrainer", "Trainer"}:
            continue
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in private:
                flag(item, f"{cls.name} overrides {item.name}")
            targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in private:
                    flag(item, f"{cls.name} sets {target.id}")
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in private | {"beta"}
            ):
                flag(node, f"self.{node.attr} in {cls.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            holder = node.value
            if (isinstance(holder, ast.Name) and holder.id in TRAINER_NAMES) or (
                isinstance(holder, ast.Attribute) and holder.attr == "trainer"
            ):
                flag(node, f"{ast.unparse(node)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            flag(node, f"{node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_module_but_the_seam_names_a_private_attribute_of_the_host():
    """Every private name of TRL's and Transformers' trainers that the package uses is in `hooks.HOST_INTERNALS`
    (or Unsloth's table), and only the two seam modules name one."""
    import pathlib

    private = host_private_names()
    root = pathlib.Path(REPO)
    violations = {
        str(path.relative_to(root)): found
        for path in sorted((root / "adaptive_kl").rglob("*.py"))
        if str(path.relative_to(root)) not in SEAM_MODULES and (found := seam_violations(path.read_text(), private))
    }
    assert not violations, violations


def test_the_seam_check_sees_each_way_of_naming_a_host_internal():
    """The source check itself: each pattern it must catch is caught, and the package's own names are not."""
    private = host_private_names()
    assert {"_metrics", "_logs", "_buffered_inputs", "_save_checkpoint", "_get_output_dir", "_tag_names"} <= private
    caught = seam_violations(
        "class T(HostHooks, GRPOTrainer):\n"
        "    _tag_names = ['x']\n"
        "    def _save_checkpoint(self, model, trial):\n"
        "        self._metrics['train']['a'].append(self.beta)\n"
        "def f(trainer):\n"
        "    trainer._logs.clear()\n"
        "    return getattr(trainer, '_buffered_inputs', None)\n",
        private,
    )
    assert len(caught) == 6, caught
    own = "class T(HostHooks, GRPOTrainer):\n    def _record(self):\n        self._step_stats = 1\n"
    assert not seam_violations(own, private)


def test_the_table_holds_every_internal_of_the_installed_host():
    """Each entry exists in the installed TRL and Transformers: methods and class attributes on the class, attributes
    on a built trainer; and the table is what `check_host` and `check_host_attributes` verify."""
    import accelerate

    from adaptive_kl.trainers.hooks import HOST_INTERNALS

    host = [internal for internal in HOST_INTERNALS if internal.owner != "accelerate.Accelerator"]
    assert {internal.name for internal in host} <= host_private_names() | {"beta", "ref_model"}
    assert {internal.kind for internal in host} == {"method", "class attribute", "attribute"}
    assert all(internal.use and internal.owner in ("trl.GRPOTrainer", "transformers.Trainer") for internal in host)
    accelerator = [internal for internal in HOST_INTERNALS if internal not in host]
    assert {internal.kind for internal in accelerator} == {"accelerator attribute"}
    assert all(hasattr(accelerate.Accelerator(cpu=True), internal.name) for internal in accelerator)


@pytest.mark.parametrize("name", ["_get_output_dir", "_load_callback_state", "_prepare_inputs", "_tag_names"])
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


@pytest.mark.parametrize("name", ["_metrics", "_logs", "_buffered_inputs", "beta", "ref_model", "_models"])
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
