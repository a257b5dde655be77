"""`KLHealthCallback` (episodes of the KL target band) and `RetentionCallback` (held-out log-likelihood and accuracy
logged with the reward), on fabricated logs and on the tiny model."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from repo_paths import TESTS
from tiny import NOISE_FACTOR, make_trainer, perturb

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers import callbacks as callbacks_module
from adaptive_kl.trainers.callbacks import KLHealthCallback, RetentionCallback, shard_rows
from adaptive_kl.trainers.generation import generate


# ------------------------------------------------------------------------------------------------ KLHealthCallback


@pytest.fixture
def warnings_seen(monkeypatch):
    """Messages passed to the callbacks module's logger.warning (the transformers logger does not propagate)."""
    seen = []
    monkeypatch.setattr(callbacks_module.logger, "warning", lambda message, *a, **k: seen.append(message))
    return seen


def feed(callback, values, start_step=1, key="kl", extra=None):
    """Calls `on_log` with `{key: value}` at consecutive steps from `start_step`."""
    for step, value in enumerate(values, start=start_step):
        state = SimpleNamespace(global_step=step)
        callback.on_log(None, state, None, logs={key: value, "reward": 0.5, **(extra or {})})


def test_one_warning_per_episode_and_rearm(warnings_seen):
    callback = KLHealthCallback(low=0.01, high=0.2, grace_steps=0, window=1)
    # steps: 1-2 inside, 3-5 above (one episode), 6 inside (re-arms), 7-8 above (second episode),
    # 9-10 below (crossing: third episode), 11 above (fourth), 12 exactly on a bound (inside)
    feed(callback, [0.05, 0.1, 0.3, 0.5, 0.25, 0.1, 0.21, 0.9, 0.001, 0.0, 0.4, 0.2])
    assert [(e["step"], e["side"]) for e in callback.episodes] == [
        (3, "above"),
        (7, "above"),
        (9, "below"),
        (11, "above"),
    ]
    assert callback.episodes[0]["value"] == 0.3
    assert len(warnings_seen) == 4
    assert "0.3" in warnings_seen[0] and "step 3" in warnings_seen[0] and "[0.01, 0.2]" in warnings_seen[0]
    assert "Raise beta." in warnings_seen[0]
    assert "Lower beta" in warnings_seen[2]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(beta=0.0),
        dict(beta=0.04),
        dict(beta=0.04, kl_adaptation_method="dynamic"),
        dict(beta=0.04, kl_controller="stepwise"),
        dict(beta=0.04, kl_controller="adaptive", beta_max=0.1),
        dict(beta=0.04, kl_controller="stepwise", beta_max=float("inf")),
        dict(beta=0.04, kl_scaling="sqrt"),
        dict(beta=0.04, kl_controller="drift", target_drift=0.3, max_steps=10, beta_max=0.1),
    ],
)
def test_the_above_band_advice_names_only_settings_the_config_accepts(kwargs, warnings_seen):
    """Each setting the warning names is written in it with its value, and the config with those settings builds: no
    target-KL controller beside `dynamic` or at β = 0, and a ceiling above β for a controller to raise β at all."""
    from adaptive_kl import AdaptiveKLGRPOConfig

    def build(**fields):
        return AdaptiveKLGRPOConfig(output_dir="unused", report_to="none", use_cpu=True, **fields)

    callback = KLHealthCallback(low=0.01, high=0.2, grace_steps=0, window=1)
    args = build(**kwargs)
    text, settings = callback.above_band_advice(args)
    for name, value in settings.items():
        assert f"{name}={value!r}" in text or f"{name}={value:g}" in text
    changed = build(**{**kwargs, **settings})
    if "kl_controller" in settings:
        assert changed.beta_max > changed.beta
    callback.on_log(args, SimpleNamespace(global_step=1), None, logs={"kl": 0.5})
    (warning,) = warnings_seen
    assert text in warning
    if "dynamic" in args.kl_methods or args.beta == 0:
        assert "kl_controller" not in settings and 'kl_controller="' not in warning
    if args.kl_controller == "drift":  # its target is the drift: lower that, not target_kl
        assert text.startswith("Lower target_drift (now 0.3)") and "target_kl" not in text
    if args.beta > 0 and args.kl_controller == "fixed" and "dynamic" not in args.kl_methods:
        # the studies' answer first: a constant β, found with the frontier command; a controller only after it
        assert "`adaptive-kl frontier`" in text and text.index("adaptive-kl frontier") < text.index("kl_controller=")
        # the drift controller next, which finds that β in one run
        assert (
            text.index("adaptive-kl frontier")
            < text.index("kl_controller='drift'")
            < text.index("kl_controller='stepwise'")
        )
        if args.kl_scaling == "none":
            assert text.startswith("Raise beta (now 0.04) and keep it constant")
        else:  # a schedule lowers β: the advice drops it, not "keep it constant"
            assert text.startswith("Raise beta (now 0.04) and hold it constant (kl_scaling='none';")
            assert "keep it constant" not in text and settings["kl_scaling"] == "none"


def test_the_running_mean_keeps_a_kl_hovering_at_a_bound_from_warning_again_and_again(warnings_seen):
    hovering = [0.009, 0.0115] * 10  # mean 0.01025: inside the band, but every other value below it
    per_value = KLHealthCallback(grace_steps=0, window=1)
    feed(per_value, hovering)
    assert len(per_value.episodes) == 10
    smoothed = KLHealthCallback(grace_steps=0, window=4)
    feed(smoothed, hovering)
    # while the window fills (steps 1 and 3 average an odd number of values); from step 4 on the mean stays inside
    assert [e["step"] for e in smoothed.episodes] == [1, 3]
    assert smoothed.episodes[1]["value"] == pytest.approx((0.009 * 2 + 0.0115) / 3)
    feed(smoothed, [0.5, 0.5], start_step=21)  # the mean of (0.009, 0.0115, 0.5, 0.5) is above the band at step 22
    assert [(e["step"], e["side"]) for e in smoothed.episodes] == [(1, "below"), (3, "below"), (22, "above")]
    assert smoothed.episodes[2]["value"] == pytest.approx((0.009 + 0.0115 + 1.0) / 4)


def test_the_grace_period_stays_out_of_the_running_mean(warnings_seen):
    callback = KLHealthCallback(grace_steps=3, window=4)
    feed(callback, [0.0, 0.0, 0.0, 0.02, 0.02])  # a mean with the grace period's zeros would be below at step 4
    assert callback.episodes == []
    feed(callback, [0.5], start_step=1)  # above the band during the grace period: judged alone, and reported
    assert [(e["step"], e["side"], e["value"]) for e in callback.episodes] == [(1, "above", 0.5)]


def test_a_restored_state_judges_on_as_the_uninterrupted_callback(warnings_seen):
    """`state_dict` survives JSON (it goes into a checkpoint) and a callback loaded from it reports the same episodes
    as one that never stopped: the running window and the current side come back, not only the episodes."""
    # step 5 starts an episode above the band (mean of 0.25, 0.1, 0.3) that step 6 continues; then below, NaN, inside
    values = [0.05, 0.3, 0.25, 0.1, 0.3, 0.3, 0.0, 0.0, 0.0, 0.4, float("nan"), 0.1]
    uninterrupted = KLHealthCallback(grace_steps=2, window=3)
    feed(uninterrupted, values)
    first = KLHealthCallback(grace_steps=2, window=3)
    feed(first, values[:5])  # stops above the band, with a full window
    resumed = KLHealthCallback(grace_steps=2, window=3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    feed(resumed, values[5:], start_step=6)
    assert resumed.episodes == uninterrupted.episodes and len(resumed.episodes) >= 3
    fresh = KLHealthCallback(grace_steps=2, window=3)  # what a resume without the state would report
    feed(fresh, values[5:], start_step=6)
    assert fresh.episodes != uninterrupted.episodes[len(first.episodes) :]


def test_bounds_are_inside_the_band(warnings_seen):
    callback = KLHealthCallback(low=0.01, high=0.2, grace_steps=0, window=1)
    feed(callback, [0.01, 0.2, 0.01])
    assert callback.episodes == [] and warnings_seen == []


def test_grace_steps_exempt_only_below_band(warnings_seen):
    callback = KLHealthCallback(grace_steps=3, window=1)
    # steps 1-3 are exempt below the band; the episode starts at step 4 and is reported once
    feed(callback, [0.0, 0.0, 0.0, 0.0, 0.001])
    assert [(e["step"], e["side"]) for e in callback.episodes] == [(4, "below")]
    callback = KLHealthCallback(grace_steps=3, window=1)
    feed(callback, [0.5, 0.0, 0.05])  # above the band at step 1 is reported; below at step 2 just re-arms
    assert [(e["step"], e["side"]) for e in callback.episodes] == [(1, "above")]
    assert len(warnings_seen) == 2


def test_nan_is_its_own_episode(warnings_seen):
    callback = KLHealthCallback(grace_steps=0, window=1)
    # NaN (or None, TRL's log of an all-NaN metric) at steps 2-4: one episode; then above at 5: a new one
    feed(callback, [0.05, float("nan"), None, float("nan"), 0.5, float("nan")])
    assert [(e["step"], e["side"]) for e in callback.episodes] == [(2, "nan"), (5, "above"), (6, "nan")]
    assert math.isnan(callback.episodes[0]["value"])
    assert len(warnings_seen) == 3 and "NaN" in warnings_seen[0]
    callback = KLHealthCallback(grace_steps=100, window=1)
    feed(callback, [float("nan")])  # the grace period does not cover NaN
    assert [e["side"] for e in callback.episodes] == ["nan"]


def test_eval_logs_and_logs_without_key_are_ignored(warnings_seen):
    callback = KLHealthCallback(grace_steps=0, window=1)
    state = SimpleNamespace(global_step=5)
    callback.on_log(None, state, None, logs={"eval_kl": 5.0, "eval_reward": 0.1})
    callback.on_log(None, state, None, logs={"kl": 5.0, "eval_loss": 0.1})  # an evaluation log
    callback.on_log(None, state, None, logs={"reward": 1.0})
    callback.on_log(None, state, None, logs=None)
    assert callback.episodes == [] and warnings_seen == []
    feed(callback, [0.5], start_step=6)  # still armed
    assert [e["step"] for e in callback.episodes] == [6]
    # a custom key, including an evaluation metric when asked for explicitly
    callback = KLHealthCallback(key="eval_kl", grace_steps=0, window=1)
    callback.on_log(None, state, None, logs={"eval_kl": 5.0, "eval_loss": 0.1})
    assert [e["side"] for e in callback.episodes] == ["above"]


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"low": -0.1}, "low"),
        ({"low": float("nan")}, "low"),
        ({"low": True}, "low"),
        ({"low": 0.2, "high": 0.2}, "high"),
        ({"low": 0.3, "high": 0.2}, "high"),
        ({"high": float("inf")}, "high"),
        ({"high": "0.2"}, "high"),
        ({"key": ""}, "key"),
        ({"grace_steps": -1}, "grace_steps"),
        ({"grace_steps": 1.5}, "grace_steps"),
        ({"window": 0}, "window"),
        ({"window": 2.0}, "window"),
    ],
)
def test_kl_health_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} "):
        KLHealthCallback(**kwargs)


# ----------------------------------------------------------------------------------------------- RetentionCallback


# Prompts and completions of different lengths (in characters = tokens of the tiny tokenizer).
SFT = {
    "prompt": ["1+1=", "12+30=", "7=", "a b c d e f", "Q: 3*3? A:"],
    "completion": ["2", " 42 ok", "seven!", "g", " 9 #### 9"],
}


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path_factory.mktemp("retention")),
        beta=0.1,
        bf16=False,
        max_steps=1,
    )


def reference_loglik(model, tokenizer, prompts, completions, dtype=torch.float64):
    """(token mean, sequence mean): one unpadded forward of each prompt+completion string, log_softmax over all in
    `dtype` (float32: the same reference with float32's rounding, whose distance to float64's is its noise floor)."""
    token_sum, tokens, seq_sums = 0.0, 0, []
    for prompt, completion in zip(prompts, completions, strict=True):
        n_prompt = len(tokenizer(prompt)["input_ids"])
        ids = torch.tensor([tokenizer(prompt + completion)["input_ids"]], device=model.device)  # a token a character
        with torch.no_grad():
            logps = model(input_ids=ids).logits.to(dtype).log_softmax(-1)[0]
        targets = ids[0, n_prompt:]
        total = logps[n_prompt - 1 : -1].gather(-1, targets[:, None]).sum().item()
        token_sum, tokens = token_sum + total, tokens + len(targets)
        seq_sums.append(total)
    return token_sum / tokens, sum(seq_sums) / len(seq_sums)


LOGLIK_KEYS = ("retention/loglik", "retention/seq_loglik")


@pytest.fixture(scope="module")
def loglik_reference(trainer) -> tuple[dict[str, float], dict[str, float]]:
    """`(means, floors)` of the two log-likelihood means, measured once on the module's model: their float64 reference
    (`reference_loglik`), and their noise floor, the larger of two measured spreads: their float32 reference against
    the float64 one (the rounding of the log-softmax and the sums), and the callback's own values over batch sizes 1,
    2 and 5 and both padding sides (the rounding of padded, batched forwards)."""
    tokenizer = trainer.processing_class
    args = (trainer.model, tokenizer, SFT["prompt"], SFT["completion"])
    float32, float64 = reference_loglik(*args, dtype=torch.float32), reference_loglik(*args)
    splits = []
    side = tokenizer.padding_side
    try:
        for tokenizer.padding_side in ("left", "right"):
            for batch_size in (1, 2, 5):
                scores = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=batch_size).evaluate()
                splits.append([scores[key] for key in LOGLIK_KEYS])
    finally:
        tokenizer.padding_side = side
    floors = {
        key: max(abs(float32[i] - float64[i]), max(split[i] for split in splits) - min(split[i] for split in splits))
        for i, key in enumerate(LOGLIK_KEYS)
    }
    assert all(0 < floor < 1e-5 for floor in floors.values()), floors  # rounding, and measured
    return dict(zip(LOGLIK_KEYS, float64)), floors


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_loglik_matches_unpadded_forward(trainer, loglik_reference, padding_side, batch_size, monkeypatch):
    tokenizer = trainer.processing_class
    monkeypatch.setattr(tokenizer, "padding_side", padding_side)
    callback = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=batch_size)
    scores = callback.evaluate()
    means, floors = loglik_reference
    assert set(scores) == set(LOGLIK_KEYS)
    for key in LOGLIK_KEYS:
        assert abs(scores[key] - means[key]) <= NOISE_FACTOR * floors[key], key
    # the two means differ here (lengths differ), so each is checked against its own definition
    assert abs(means["retention/loglik"] - means["retention/seq_loglik"]) > 1e-3
    assert tokenizer.padding_side == padding_side


def test_kl_to_start_is_the_exact_kl_to_the_starting_policy(trainer):
    """The first evaluation records the starting policy (KL 0); after the weights move, the KL is Σ_v p (log p − log q)
    over every completion position, averaged over tokens, computed here from unpadded forwards before and after."""
    model, tokenizer = trainer.model, trainer.processing_class

    def completion_logps():  # per row: (completion tokens, vocab) log-probabilities, one unpadded forward each
        rows = []
        for prompt, completion in zip(SFT["prompt"], SFT["completion"], strict=True):
            n_prompt = len(tokenizer(prompt)["input_ids"])
            ids = torch.tensor([tokenizer(prompt + completion)["input_ids"]], device=model.device)
            with torch.no_grad():
                rows.append(model(input_ids=ids).logits.double().log_softmax(-1)[0, n_prompt - 1 : -1])
        return rows

    callback = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=2, kl_to_start=True)
    assert callback.evaluate()["retention/kl_to_start"] == 0.0
    start = completion_logps()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        perturb(model)
        scores = callback.evaluate()
        now = completion_logps()
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(original[name])
    kl = sum(torch.nn.functional.kl_div(q, p, log_target=True, reduction="sum") for p, q in zip(now, start))  # KL(p‖q)
    expected = kl.item() / sum(len(p) for p in now)
    assert expected > 1e-3
    assert scores["retention/kl_to_start"] == pytest.approx(expected, rel=1e-4)


def test_record_start_keeps_the_start_through_train_begin(trainer):
    """`record_start()` on the starting policy, then train begin on moved weights (as a resume loads them): the KL is
    measured to the recorded start, and train begin neither re-records it nor adds a baseline."""
    model = trainer.model
    callback = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=2, kl_to_start=True)
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        callback.record_start()
        assert [e["step"] for e in callback.history] == [0] and callback.history[0]["retention/kl_to_start"] == 0.0
        perturb(model)
        callback.on_train_begin(None, SimpleNamespace(global_step=3), None)
        assert [e["step"] for e in callback.history] == [0]
        assert callback.evaluate()["retention/kl_to_start"] > 1e-3
        callback.on_train_begin(None, SimpleNamespace(global_step=0), None)  # a later train(): starts afresh
        assert callback.history[-1]["retention/kl_to_start"] == 0.0
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(original[name])


def test_loglik_shards_rows_evenly_across_processes():
    """The held-out rows of the retention and drift measurements, 5 over 2 processes."""
    shards = [shard_rows(SimpleNamespace(num_processes=2, process_index=index), 5) for index in range(2)]
    assert shards == [([0, 2, 4], [1, 1, 1]), ([1, 3, 0], [1, 1, 0])]  # same length: same number of batches


def test_model_mode_is_restored(trainer):
    model = trainer.model
    modes = []
    hook = model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    try:
        callback = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=2)
        model.train()
        callback.evaluate()
        assert model.training and modes and not any(modes)  # evaluated in eval mode, restored to train mode
        model.eval()
        callback.evaluate()
        assert not model.training
    finally:
        hook.remove()
        model.train()


def test_accuracy_with_fake_score_function(trainer):
    data = {"prompt": ["1+1=", "2+2=", "3+3=", "4+4=", "5+5="], "answer": ["a", "b", "c", "d", "e"]}
    calls = []

    def score(completions, prompts, answer, **kwargs):
        calls.append(dict(completions=completions, prompts=prompts, answer=answer, **kwargs))
        return [{"a": 1.0, "b": 0.0, "c": None, "d": 1.0, "e": 1.0}[x] for x in answer]  # None is left out

    callback = RetentionCallback(
        trainer, Dataset.from_dict(data), metric="accuracy", batch_size=2, max_new_tokens=3, score_fn=score
    )
    trainer.model.train()
    scores = callback.evaluate()
    assert scores == {"retention/accuracy": pytest.approx(3 / 4)}
    assert trainer.model.training
    assert len(calls) == 1 and calls[0]["prompts"] == data["prompt"] and calls[0]["answer"] == data["answer"]
    expected = generate(trainer.model, trainer.processing_class, data["prompt"], max_new_tokens=3)
    assert calls[0]["completions"] == expected


def test_accuracy_accepts_a_task_reward_function(trainer):
    from adaptive_kl.tasks import accuracy_reward

    data = {"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}
    callback = RetentionCallback(
        trainer, Dataset.from_dict(data), metric="accuracy", max_new_tokens=2, score_fn=accuracy_reward
    )
    assert callback.evaluate() == {"retention/accuracy": 0.0}  # random tiny model: no "#### answer" format


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eval_steps": 0}, "eval_steps must be an int >= 1"),
        ({"eval_steps": 2.0}, "eval_steps must be an int >= 1"),
        ({"metric": "bleu"}, r"metric must be one of \('loglik', 'accuracy'\)"),
        ({"batch_size": 0}, "batch_size must be"),
        ({"prefix": ""}, "prefix must be"),
        ({"dataset": {"prompt": ["x"]}}, "dataset must have columns"),
        ({"dataset": {"prompt": [], "completion": []}}, "dataset is empty"),
        ({"dataset": {"prompt": [[{"role": "user", "content": "x"}]], "completion": ["y"]}}, "plain strings"),
        ({"dataset": {"prompt": ["x", "y"], "completion": ["z", ""]}}, "row 1: the completion"),
        ({"metric": "accuracy", "max_new_tokens": 4}, "score_fn must be a callable"),
        ({"kl_to_start": 1}, "^kl_to_start must be True or False"),
        ({"kl_to_start": True, "metric": "accuracy"}, "^kl_to_start=True needs metric='loglik'"),
        ({"metric": "accuracy", "score_fn": lambda completions, **k: [1.0]}, "max_new_tokens must be an int >= 1"),
        (
            {"metric": "accuracy", "max_new_tokens": 4, "score_fn": lambda completions, answer, **k: [1.0]},
            r"dataset lacks column\(s\) \['answer'\]",
        ),
    ],
)
def test_retention_rejects_bad_arguments(trainer, kwargs, message):
    kwargs = {"dataset": Dataset.from_dict(SFT), **kwargs}
    with pytest.raises(ValueError, match=message):
        RetentionCallback(trainer, **kwargs)


def test_retention_rejects_a_trainer_without_metric_store():
    with pytest.raises(ValueError, match="^trainer must be a TRL trainer"):
        RetentionCallback(SimpleNamespace(), Dataset.from_dict(SFT))


# --------------------------------------------------------------------------------------------------- end to end


def test_retention_logged_with_reward_during_training(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / "out"),
        beta=0.1,
        bf16=False,
        max_steps=4,
        logging_steps=1,
    )
    retention = RetentionCallback(trainer, Dataset.from_dict(SFT), eval_steps=2, batch_size=2)
    health = KLHealthCallback()
    trainer.add_callback(retention)
    trainer.add_callback(health)
    trainer.train()

    assert [h["step"] for h in retention.history] == [0, 2, 4]
    logged = {h["step"]: h for h in trainer.state.log_history if "reward" in h}
    assert sorted(logged) == [1, 2, 3, 4]
    for step in (2, 4):
        entry = logged[step]
        assert "retention/loglik" in entry and "retention/seq_loglik" in entry
        record = next(h for h in retention.history if h["step"] == step)
        assert entry["retention/loglik"] == pytest.approx(record["retention/loglik"], rel=1e-12)
    for step in (1, 3):
        assert "retention/loglik" not in logged[step]
    assert not any("retention/loglik" in h for h in trainer.state.log_history if h.get("step") not in (2, 4))
    # the policy changed (lr 1e-2), so the held-out log-likelihood moved away from the baseline
    assert retention.history[-1]["retention/loglik"] != retention.history[0]["retention/loglik"]
    # the first step's KL is 0 (policy = reference): within the grace period, not reported
    assert all(e["step"] > 1 for e in health.episodes if e["side"] == "below")


def test_retention_with_logging_steps_not_dividing_eval_steps(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / "out"),
        bf16=False,
        max_steps=4,
        logging_steps=3,
    )
    retention = RetentionCallback(trainer, Dataset.from_dict(SFT), eval_steps=2)
    trainer.add_callback(retention)
    trainer.train()
    assert [h["step"] for h in retention.history] == [0, 2, 4]
    logged = {h["step"]: h for h in trainer.state.log_history if "reward" in h}
    # step 2's evaluation goes into step 3's entry; step 4's (no regular log follows) into the final summary
    assert logged[3]["retention/loglik"] == pytest.approx(retention.history[1]["retention/loglik"], rel=1e-12)
    summary = trainer.state.log_history[-1]
    assert "train_runtime" in summary
    assert summary["retention/loglik"] == pytest.approx(retention.history[2]["retention/loglik"], rel=1e-12)


# Run under `accelerate launch --num_processes 2`: 5 rows over 2 processes (shards of 3 and 2 rows, batches of 2).
TWO_PROCESS_WORKER = """
import json, sys
sys.path.insert(0, {tests!r})
from datasets import Dataset
from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.callbacks import RetentionCallback
from tiny import make_trainer, perturb

sft = {sft!r}
trainer = make_trainer(
    AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, {model_dir!r}, output_dir={out!r}, bf16=False, max_steps=1
)
scores = RetentionCallback(trainer, Dataset.from_dict(sft), batch_size=2).evaluate()
data = {{"prompt": sft["prompt"], "answer": list(range(len(sft["prompt"])))}}
score = lambda completions, prompts, answer, **k: [float(a) for a in answer]
scores.update(
    RetentionCallback(
        trainer, Dataset.from_dict(data), metric="accuracy", max_new_tokens=3, batch_size=2, score_fn=score
    ).evaluate()
)
drift = RetentionCallback(trainer, Dataset.from_dict(sft), batch_size=2, kl_to_start=True)
drift.evaluate()  # records the starting policy
perturb(trainer.model)
scores["retention/kl_to_start"] = drift.evaluate()["retention/kl_to_start"]
with open(f"{out}/scores{{trainer.accelerator.process_index}}.json", "w") as f:
    json.dump(scores, f)
# Leave together: a rank exiting while gloo's threads still serve the other aborts it ("terminate called without an
# active exception"), which happened on a loaded machine.
trainer.accelerator.wait_for_everyone()
import torch.distributed
torch.distributed.destroy_process_group()
"""


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)
def test_two_processes_shard_and_reduce_to_the_global_value(trainer, loglik_reference, tiny_model_dir, tmp_path):
    import json

    from tiny import launch_two_processes

    script = tmp_path / "worker.py"
    script.write_text(TWO_PROCESS_WORKER.format(tests=TESTS, sft=SFT, model_dir=tiny_model_dir, out=str(tmp_path)))
    launch_two_processes(str(script))
    results = [json.loads((tmp_path / f"scores{i}.json").read_text()) for i in range(2)]
    means, floors = loglik_reference
    # The KL to the start on one process, its rows split into batches of 1, 2 and 5: the spread is its noise floor
    one_process = []
    original = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    for batch_size in (1, 2, 5):
        drift = RetentionCallback(trainer, Dataset.from_dict(SFT), batch_size=batch_size, kl_to_start=True)
        drift.evaluate()
        perturb(trainer.model)
        one_process.append(drift.evaluate()["retention/kl_to_start"])
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                p.copy_(original[name])
    kl_floor = max(one_process) - min(one_process)
    assert 0 < kl_floor < 1e-5 * one_process[1] and one_process[1] > 1e-3
    for scores in results:
        for key in LOGLIK_KEYS:
            assert abs(scores[key] - means[key]) <= NOISE_FACTOR * floors[key], key
        assert scores["retention/accuracy"] == pytest.approx(2.0)  # mean of 0..4: every row once, padding left out
        assert abs(scores["retention/kl_to_start"] - one_process[1]) <= NOISE_FACTOR * kl_floor
    assert results[0] == results[1]
