"""Training-health callbacks: a KL target-band monitor and a retention ("SFT eval") evaluation next to the reward.

The rule of thumb they implement: keep the mean per-token KL to the reference inside a target band (0.01–0.2 by
default). Above it the policy drifts too far from the reference; below it, after the first steps, the policy hardly
moves (it is not learning). Independently, a falling score on held-out reference data (log-likelihood of reference
completions, or accuracy on a held-out task) shows forgetting, which the training reward alone does not.

```python
trainer = AdaptiveKLGRPOTrainer(..., callbacks=[KLHealthCallback()])
trainer.add_callback(RetentionCallback(trainer, sft_eval, eval_steps=50))  # columns "prompt", "completion"
trainer.train()
```
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import math

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from ..kl.controller import drift_path
from ..kl.validation import is_finite_number, is_int
from .generation import generate, prompt_texts
from .hooks import metric_store
from .reference import REFERENCE_ADAPTER


logger = logging.get_logger(__name__)

RETENTION_METRICS = ("loglik", "accuracy")
# Held-out texts a forward of the drift's: a real model's (batch, length, vocabulary) logits stay small
DRIFT_BATCH_SIZE = 8


class KLHealthCallback(TrainerCallback):
    """Warns when the logged mean KL leaves the target band `[low, high]`, once per episode.

    The value judged is the running mean of the last `window` finite values logged after the grace period: per-step
    KL is noisy, and a run whose KL hovers at a bound would otherwise start a new episode every few steps. An episode
    is a maximal run of
    consecutive judged values on the same side of the band: `"above"` (> `high`),
    `"below"` (< `low`) or `"nan"` (a NaN KL, or `None`, which is how TRL logs a metric whose values were all NaN).
    The warning fires when an episode starts; a value inside the band (bounds included) re-arms the callback, and a
    value on another side starts a new episode at once. Every reported episode is appended to `self.episodes` as
    `{"step", "side", "value"}`.

    Below-band values logged at optimizer steps `1 … grace_steps` are exempt (they count as inside the band): the KL
    is exactly 0 at the first step of every run, since the policy starts as the reference. Above-band and NaN values
    are reported from the first step.

    Only training logs are read: logs without `key` are ignored, and so are evaluation logs (any key starting with
    `eval_`) unless `key` itself names an evaluation metric (e.g. `"eval_kl"`).

    Args:
        low, high: the target band, finite, `0 <= low < high`.
        key: the logged metric to monitor (`"kl"`: TRL's mean per-token KL, which `AdaptiveKLGRPOTrainer` logs as
            well; `"adaptive_kl/raw_kl"` for the chosen `kl_estimator`'s mean, which can be negative with k1).
        grace_steps: number of initial optimizer steps whose below-band values are not reported (int >= 0).
        window: number of logged values in the running mean (int >= 1; 1 judges each value alone).

    Raises:
        ValueError: naming the argument, for a band that is not finite and ordered, an empty `key` or a negative
            `grace_steps`.
    """

    def __init__(self, low: float = 0.01, high: float = 0.2, key: str = "kl", grace_steps: int = 10, window: int = 10):
        if not is_finite_number(low) or low < 0:
            raise ValueError(f"low must be a finite number >= 0, got {low!r}.")
        if not is_finite_number(high) or high <= low:
            raise ValueError(f"high must be a finite number > low ({low!r}), got {high!r}.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be the name of a logged metric (a non-empty string), got {key!r}.")
        if not (is_int(grace_steps) and grace_steps >= 0):
            raise ValueError(f"grace_steps must be an int >= 0, got {grace_steps!r}.")
        if not (is_int(window) and window >= 1):
            raise ValueError(f"window must be an int >= 1, got {window!r}.")
        self.low, self.high, self.key, self.grace_steps = float(low), float(high), key, grace_steps
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.episodes: list[dict] = []
        self._side: str | None = None  # side of the current episode; None: armed (last value inside the band)

    def _classify(self, value: float, step: int) -> str | None:
        if math.isnan(value):
            return "nan"
        if value > self.high:
            return "above"
        if value < self.low and step > self.grace_steps:
            return "below"
        return None

    def above_band_advice(self, args) -> tuple[str, dict]:
        """What to change when the KL is above the band, for the training arguments `args`: the sentence, and the
        settings it names with their values (`{}` where it names none), each one a configuration `args`'s class
        accepts. A constant β comes first, as the studies found (docs/studies/README.md); a target-KL controller only
        after it, where the config has one and can take it (β > 0, no `dynamic`), with a ceiling above β so that it
        can raise β at all."""
        if args is None:  # no configuration to read
            return "Raise beta.", {}
        beta = getattr(args, "beta", None)
        if not beta:  # β = 0: nothing holds the policy, and no adaptation is accepted at 0
            return "Set beta > 0: at beta=0 nothing holds the policy near the reference.", {}
        controller = getattr(args, "kl_controller", None)
        if controller is None:  # the host's own config: it has no controller
            return "Raise beta.", {}
        if "dynamic" in args.kl_methods:  # a controller is refused beside `dynamic`
            return (
                f"Raise beta_min (now {args.beta_min:g}), the least beta 'dynamic' decays to, or beta; a target-KL "
                "controller cannot be combined with 'dynamic'.",
                {},
            )
        if controller != "fixed":
            target = (
                f"Lower target_drift (now {args.target_drift:g}): the drift controller holds the drift from the "
                "start on held-out texts, not the training KL"
                if controller == "drift"
                else f"Lower target_kl (now {args.target_kl:g}) into the band"
            )
            if args.beta_max == math.inf:  # no ceiling to raise
                return f"{target}.", {}
            ceiling = beta if args.beta_max is None else args.beta_max
            settings = {"beta_max": 2 * ceiling}
            return (
                f"{target}; if beta sits at its ceiling (beta_max={ceiling:g}), raise it "
                f"(beta_max={settings['beta_max']:g}).",
                settings,
            )
        middle = float(f"{(self.low + self.high) / 2:.3g}")  # the band's middle, as a reader would write it
        settings = {"kl_controller": "stepwise", "target_kl": middle, "beta_max": float(f"{4 * beta:.3g}")}
        constant = "keep it constant"
        if args.kl_scaling != "none":  # a schedule lowers β at every step: the KL grows as it falls
            constant = f"hold it constant (kl_scaling='none'; kl_scaling={args.kl_scaling!r} lowers it at every step)"
            settings = {"kl_scaling": "none", **settings}
        return (
            f"Raise beta (now {beta:g}) and {constant}: in the package's frontier studies no adaptive method or "
            "target-KL controller was detected earning more reward than a constant beta at the same drift, and "
            "`adaptive-kl frontier` measures the drift each constant beta gives on your model. To land the drift you "
            "accept in one run instead of a sweep, kl_controller='drift' with target_drift=<that drift> and held-out "
            "texts as eval_dataset sets beta for you (docs/frontier.md). Only where the KL "
            "itself must stay in the band, a target-KL controller can steer it ("
            + ", ".join(f"{name}={value!r}" for name, value in settings.items())
            + "; none was shown to hold its target within +-50% in those studies).",
            settings,
        )

    def _message(self, side: str, value: float, step: int, args=None) -> str:
        where = f"Mean KL `{self.key}` = {value:.4g} (last {len(self._recent)} logs) at step {step}"
        band = f"the target band [{self.low:g}, {self.high:g}]"
        if side == "above":
            return (
                f"{where} is above {band}: the policy is drifting too far from the reference. "
                f"{self.above_band_advice(args)[0]} A lower learning rate also helps. Watch the retention metrics for "
                "forgetting."
            )
        if side == "below":
            adapts = getattr(args, "kl_controller", "fixed") != "fixed" or "dynamic" in getattr(args, "kl_methods", ())
            lower = "beta (or beta_min, where beta adapts)" if adapts else "beta"
            return (
                f"{where} is below {band} after {self.grace_steps} grace steps: the policy barely moves from the "
                f"reference and may not be learning. Lower {lower}, or raise the learning rate; check that "
                "rewards vary within groups (frac_reward_zero_std)."
            )
        return (
            f"Mean KL `{self.key}` is NaN at step {step}: the KL estimate is invalid (overflowing log-ratios, an "
            "empty completion mask, or a diverged policy). Check the loss and grad_norm, lower the learning rate, and "
            "use bf16/fp32 rather than fp16."
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self.key not in logs:
            return
        if not self.key.startswith("eval_") and any(str(k).startswith("eval_") for k in logs):
            return
        value = logs[self.key]
        if value is None:
            value = float("nan")
        try:
            value = float(value)
        except (TypeError, ValueError):
            return  # not a number: nothing to judge
        step = state.global_step
        if not math.isnan(value) and step > self.grace_steps:
            # The grace period's values (near 0 from step 1) stay out of the mean, which would otherwise report a
            # below-band episode as soon as it ends; during it each value is judged alone (above-band and NaN only).
            self._recent.append(value)
            value = sum(self._recent) / len(self._recent)
        side = self._classify(value, step)
        if side is not None and side != self._side:
            self.episodes.append({"step": step, "side": side, "value": value})
            if getattr(state, "is_world_process_zero", True):  # every process sees the same (reduced) KL
                logger.warning(self._message(side, value, step, args))
        self._side = side

    def state_dict(self) -> dict:
        """What a resumed run needs to judge on as the uninterrupted one does: the episodes reported so far, the
        running window and the side of the current episode (plain JSON types)."""
        return {"episodes": [dict(e) for e in self.episodes], "recent": list(self._recent), "side": self._side}

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` returned."""
        self.episodes = [dict(e) for e in state["episodes"]]
        self._recent.clear()
        self._recent.extend(float(v) for v in state["recent"])
        self._side = state["side"]


class RetentionCallback(TrainerCallback):
    """Evaluates retention on a held-out set every `eval_steps` optimizer steps, logged with that step's reward.

    Metrics (`prefix` = `"retention"` by default):

    - `metric="loglik"`: `dataset` has string columns `prompt` and `completion` (reference completions). Logs
      `{prefix}/loglik`, the mean per-token log-likelihood of the completion tokens given the prompt under the
      current policy (token-weighted over the whole set), and `{prefix}/seq_loglik`, the mean over examples of each
      completion's summed log-likelihood. The prompt is tokenized as `GRPOTrainer` tokenizes plain-text prompts for
      generation (the tokenizer's defaults, so a BOS is prepended exactly where the tokenizer adds one); the
      completion is tokenized separately without special tokens and its ids are appended, so the completion boundary
      is exact and nothing is inserted between the two. No EOS is appended: only the completion text is scored.
      Sequences are right-padded by the callback itself, so the tokenizer's `padding_side` is neither used nor
      changed and padding cannot shift positions. Rows whose prompt or completion tokenize to nothing are rejected.
      With `kl_to_start=True` it also logs `{prefix}/kl_to_start`: the exact KL(π_θ ‖ π_start) of the next-token
      distributions at the same positions, summed over the vocabulary and averaged over completion tokens, where
      π_start is the policy at this `train()`'s first evaluation (train begin), or the one `record_start()` saw
      before it: a resume loads the trained weights before train begin, so a resumed run that does not call
      `record_start()` on the starting policy first measures drift from the resumed one. It measures drift from the
      start whether or not the trainer has a reference model (β = 0 included), on fixed contexts, so it has no
      sampling noise. It holds the starting policy's log-probabilities of those positions on the CPU: completion
      tokens × vocabulary × 4 bytes (0.3 MB for the embedded task; ~1 GB for 1,000 tokens of a 250k vocabulary).
    - `metric="accuracy"`: `dataset` has a string column `prompt` plus whatever columns `score_fn` needs. Greedy
      completions (`max_new_tokens` new tokens, left-padded batches) are scored by
      `score_fn(completions=[str], prompts=[str], **other_columns) -> list[float]`, the signature of a TRL reward
      function (e.g. `adaptive_kl.tasks.accuracy_reward`); scores of `None` are left out, as TRL does with rewards.
      Logs `{prefix}/accuracy`, the mean score.

    Schedule: once at `on_train_begin` or `record_start()` (the baseline, stored in `self.history` only) and at
    `on_step_end` when `global_step % eval_steps == 0` or at the last step. Each result is appended to `self.history`
    as `{"step", <metric names>: value}` and to the trainer's metric store (`hooks.metric_store`), which
    `GRPOTrainer.log` averages into the next training log entry, right after `on_step_end` of a logging step: every
    `report_to` backend receives it in the same entry as that step's `reward`. When `logging_steps` does not divide
    `eval_steps`, the value appears in the next logged entry instead (averaged with any other evaluation made before
    it; a last one that no regular log follows goes into the end-of-training summary entry, unless an evaluation ran
    just before it, which leaves the model in eval mode so that TRL's `log` reads its eval metrics: then that value
    is in `self.history` only).

    Evaluation runs without gradients, in eval mode (restored afterwards) and under the trainer's mixed-precision
    autocast, on `trainer.accelerator.unwrap_model(trainer.model)` with `trainer.processing_class` as tokenizer.
    Under several processes the set is sharded (row `i` to process `i % num_processes`); every process runs the same
    number of batches (short shards are padded with zero-weight copies of a row, so collective model calls line up)
    and the sums are reduced with `trainer.accelerator.reduce`, so every process logs the same global value. Models
    whose parameters are sharded across processes (FSDP, DeepSpeed ZeRO-3) are not supported. The dataset is held in
    memory (and, for "loglik", pre-tokenized) from construction on; the history is not saved in checkpoints.

    Raises:
        ValueError: naming the argument, for `eval_steps`/`batch_size` < 1, an unknown `metric`, missing or non-string
            columns, an empty dataset, a missing `score_fn` or `max_new_tokens` for "accuracy", a column a required
            parameter of `score_fn` names but the dataset lacks, or a trainer without TRL's metric store.
    """

    def __init__(
        self,
        trainer,
        dataset,
        eval_steps: int = 50,
        metric: str = "loglik",
        batch_size: int = 32,
        max_new_tokens: int | None = None,
        score_fn=None,
        prefix: str = "retention",
        kl_to_start: bool = False,
    ):
        if not (is_int(eval_steps) and eval_steps >= 1):
            raise ValueError(f"eval_steps must be an int >= 1, got {eval_steps!r}.")
        if metric not in RETENTION_METRICS:
            raise ValueError(f"metric must be one of {RETENTION_METRICS}, got {metric!r}.")
        if not (is_int(batch_size) and batch_size >= 1):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty string, got {prefix!r}.")
        if not isinstance(kl_to_start, bool):
            raise ValueError(f"kl_to_start must be True or False, got {kl_to_start!r}.")
        if kl_to_start and metric != "loglik":
            raise ValueError(f"kl_to_start=True needs metric='loglik' (it scores the completions), got {metric!r}.")
        store = trainer._metrics if hasattr(trainer, "_metrics") else None  # TRL's metric store (`hooks.metric_store`)
        if not (isinstance(store, dict) and "train" in store):
            raise ValueError(
                "trainer must be a TRL trainer with TRL's metric store (GRPOTrainer, AdaptiveKLGRPOTrainer), "
                f"got {type(trainer).__name__}."
            )
        columns = list(getattr(dataset, "column_names", None) or (dataset if isinstance(dataset, dict) else []))
        required = ("prompt", "completion") if metric == "loglik" else ("prompt",)
        missing = [c for c in required if c not in columns]
        if missing:
            raise ValueError(f"dataset must have columns {required} for metric={metric!r}; missing {missing}.")
        data = {c: list(dataset[c]) for c in columns}
        if not data["prompt"]:
            raise ValueError("dataset is empty.")
        for c in required:
            if not all(isinstance(x, str) for x in data[c]):
                raise ValueError(f"dataset column {c!r} must hold plain strings (render chat prompts first).")
        if metric == "accuracy":
            if not callable(score_fn):
                raise ValueError(f"score_fn must be a callable for metric='accuracy', got {score_fn!r}.")
            if not (is_int(max_new_tokens) and max_new_tokens >= 1):
                raise ValueError(f"max_new_tokens must be an int >= 1 for metric='accuracy', got {max_new_tokens!r}.")
            try:  # the parameters of `score_fn` without a default (keyword-passable ones only); none when unknown
                parameters = inspect.signature(score_fn).parameters.values()
            except (TypeError, ValueError):
                parameters = []
            kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            required_names = [p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty]
            needed = [c for c in required_names if c not in ("completions", "prompts")]
            if [c for c in needed if c not in columns]:
                raise ValueError(
                    f"dataset lacks column(s) {[c for c in needed if c not in columns]} that score_fn "
                    f"{getattr(score_fn, '__name__', score_fn)!r} requires; it has {columns}."
                )
        self.trainer, self.tokenizer = trainer, trainer.processing_class
        self.metric, self.eval_steps, self.batch_size = metric, eval_steps, batch_size
        self.max_new_tokens, self.score_fn, self.prefix = max_new_tokens, score_fn, prefix
        self.kl_to_start = kl_to_start
        self.data = data
        # Row → the starting policy's log-probabilities at its completion positions, (completion tokens, vocab),
        # filled by the first evaluation (at train begin, or the first `evaluate()` called outside training).
        self._start_logps: dict[int, torch.Tensor] = {}
        self.history: list[dict] = []
        self._last_step: int | None = None
        self._start_recorded = False  # `record_start()` ran: the next train begin keeps its start
        if metric == "loglik":
            self._tokenized = [
                self._tokenize(i, p, c) for i, (p, c) in enumerate(zip(data["prompt"], data["completion"]))
            ]

    def _tokenize(self, index: int, prompt: str, completion: str) -> tuple[list[int], list[int]]:
        prompt_ids, completion_ids = prompt_and_completion_ids(self.tokenizer, prompt, completion)
        if not prompt_ids or not completion_ids:
            empty = "prompt" if not prompt_ids else "completion"
            raise ValueError(f"dataset row {index}: the {empty} tokenizes to no tokens, so it cannot be scored.")
        return prompt_ids, completion_ids

    # ----------------------------------------------------------------------------------------------------- schedule

    def record_start(self) -> None:
        """Evaluates the current policy now as the start: the baseline (step 0 in `self.history`) and, with
        `kl_to_start`, π_start. Call it on the starting policy before `trainer.train(resume_from_checkpoint=...)`:
        the next train begin then keeps this start instead of taking the resumed policy for it."""
        self._start_logps, self._last_step = {}, None
        self._evaluate(0, log=False)
        self._start_recorded = True

    def on_train_begin(self, args, state, control, **kwargs):
        if self._start_recorded:  # `record_start()` measured the start before a resume loaded the trained weights
            self._start_recorded = False
            return
        self._start_logps, self._last_step = {}, None  # each train() starts afresh, and measures drift from its start
        self._evaluate(state.global_step, log=False)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0 or state.global_step >= state.max_steps:
            self._evaluate(state.global_step, log=True)

    def _evaluate(self, step: int, log: bool) -> None:
        if self._last_step == step:
            return
        self._last_step = step
        scores = self.evaluate()
        self.history.append({"step": step, **scores})
        if log:
            for name, value in scores.items():
                metric_store(self.trainer, "train")[name].append(value)

    # --------------------------------------------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        """Runs the evaluation now on the current policy and returns `{metric name: value}` (records nothing)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self.trainer.accelerator.autocast():
                return self._loglik(model) if self.metric == "loglik" else self._accuracy(model)
        finally:
            model.train(was_training)

    def _loglik(self, model) -> dict[str, float]:
        rows, weights = shard_rows(self.trainer.accelerator, len(self.data["prompt"]))
        total = tokens = sequences = kl = 0.0  # Σ log-likelihood, completion tokens, sequences, Σ per-token KL
        record_start = self.kl_to_start and not self._start_logps
        for start in range(0, len(rows), self.batch_size):
            batch = [self._tokenized[i] for i in rows[start : start + self.batch_size]]
            batch_weights = weights[start : start + self.batch_size]
            batch_logps = completion_log_probs(model, batch, self.tokenizer)
            row_sums, row_kls = [], []
            for row, (_, c), logps in zip(rows[start : start + self.batch_size], batch, batch_logps, strict=True):
                row_sums.append(logps.gather(-1, torch.tensor(c, device=logps.device)[:, None]).sum())
                if record_start:
                    self._start_logps[row] = logps.cpu()
                if self.kl_to_start:
                    start_logps = self._start_logps[row].to(logps.device)
                    # Σ over the row's tokens of Σ_v p (log p − log q)
                    row_kls.append((logps.exp() * (logps - start_logps)).sum())
            row_sums = torch.stack(row_sums).double().tolist()
            row_kls = torch.stack(row_kls).double().tolist() if row_kls else [0.0] * len(batch)
            for (_, c), w, s, k in zip(batch, batch_weights, row_sums, row_kls, strict=True):
                total += w * s
                kl += w * k
                tokens += w * len(c)
                sequences += w
        total, tokens, sequences, kl = sum_over_processes(self.trainer.accelerator, [total, tokens, sequences, kl])
        # The same sum, per token and per sequence.
        scores = {f"{self.prefix}/loglik": total / tokens, f"{self.prefix}/seq_loglik": total / sequences}
        if self.kl_to_start:
            scores[f"{self.prefix}/kl_to_start"] = kl / tokens
        return scores

    def _accuracy(self, model) -> dict[str, float]:
        rows, weights = shard_rows(self.trainer.accelerator, len(self.data["prompt"]))
        prompts = [self.data["prompt"][i] for i in rows]
        # Padding rows are generated too (every process makes the same generate calls), then dropped.
        completions = generate(model, self.tokenizer, prompts, self.max_new_tokens, batch_size=self.batch_size)
        real = [i for i, w in zip(rows, weights, strict=True) if w]
        completions = completions[: len(real)]
        total = count = 0.0
        if real:
            other = {c: [self.data[c][i] for i in real] for c in self.data if c != "prompt"}
            scores = self.score_fn(completions=completions, prompts=prompts[: len(real)], **other)
            if len(scores) != len(real):
                raise ValueError(f"score_fn returned {len(scores)} scores for {len(real)} completions.")
            valid = [float(s) for s in scores if s is not None and not math.isnan(float(s))]
            total, count = sum(valid), float(len(valid))
        total, count = sum_over_processes(self.trainer.accelerator, [total, count])
        return {f"{self.prefix}/accuracy": total / count if count else float("nan")}


# --- held-out texts, scored on every process -------------------------------------------------------------------------


def prompt_and_completion_ids(
    tokenizer, prompt: str, completion: str, add_special_tokens: bool = True
) -> tuple[list[int], list[int]]:
    """The token ids of a `prompt` text (with the tokenizer's special tokens, as `GRPOTrainer` tokenizes a plain-text
    prompt for generation; without, for a rendered chat template: `generation.prompt_texts`) and of its `completion`
    (no special tokens), tokenized apart so that the boundary between them is exact."""
    prompt_ids = list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    return prompt_ids, list(tokenizer(completion, add_special_tokens=False)["input_ids"])


def completion_log_probs(model, rows: list[tuple[list[int], list[int]]], tokenizer) -> list[torch.Tensor]:
    """For each `(prompt ids, completion ids)` of `rows`, the float32 log-probabilities `(completion tokens,
    vocabulary)` that `model` gives at its completion's positions, in one right-padded forward (positions of real
    tokens start at 0, so padding cannot shift them)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        input_ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention_mask[i, : len(p) + len(c)] = 1
    device = next(model.parameters()).device
    logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False).logits
    # logits at position t predict token t + 1: completion tokens p..p+c-1 are predicted at p-1..p+c-2
    return [logits[i, len(p) - 1 : len(p) + len(c) - 1].float().log_softmax(-1) for i, (p, c) in enumerate(rows)]


def shard_rows(accelerator, n: int) -> tuple[list[int], list[int]]:
    """This process's rows of `n` (row `i` to process `i % num_processes`), padded to the largest shard with row 0,
    and their weights (0 for the padding): every process then runs the same number of batches, so collective model
    calls line up."""
    processes = accelerator.num_processes
    rows = list(range(accelerator.process_index, n, processes))
    size = -(-n // processes)
    return rows + [0] * (size - len(rows)), [1] * len(rows) + [0] * (size - len(rows))


def sum_over_processes(accelerator, sums: list[float]) -> list[float]:
    """`sums` summed over the processes (a collective), in float64 where the device has it."""
    if accelerator.num_processes == 1:
        return sums
    dtype = torch.float64 if accelerator.device.type in ("cpu", "cuda") else torch.float32
    return accelerator.reduce(torch.tensor(sums, dtype=dtype, device=accelerator.device), "sum").tolist()


@contextlib.contextmanager
def start_policy(policy, ref_model):
    """The starting policy, to call inside: TRL's full-model `ref_model`; for a PEFT `policy` (`ref_model` is None),
    `policy` with its `"ref"` adapter (a model that arrived with a trained adapter) or with its adapters switched off
    (a new one), as TRL scores its reference: no second model in memory."""
    if ref_model is not None:
        yield ref_model
    elif REFERENCE_ADAPTER in policy.peft_config:
        active = policy.active_adapter
        policy.set_adapter(REFERENCE_ADAPTER)
        try:
            yield policy
        finally:
            policy.set_adapter(active)  # PEFT marks only the active adapter trainable: "ref" frozen again
    else:
        with policy.disable_adapter():
            yield policy


class DriftCallback(TrainerCallback):
    """The drift controller's measurement (`kl_controller="drift"`): after every `drift_every` optimizer steps and the
    last, the exact KL of the policy's next-token distributions to the starting policy's on held-out texts, summed over
    the vocabulary and averaged over their completion tokens (as `RetentionCallback(kl_to_start=True)` and the
    frontier's drift), handed to the trainer's `BetaController` and logged as `adaptive_kl/drift` beside the drift the
    controller asked for there, `adaptive_kl/drift_target` (`kl.controller.drift_path`).

    The texts are the first `drift_samples` rows of `dataset` (the trainer's `eval_dataset`): its `prompt` (plain text
    or a conversation, rendered as the trainer renders it for generation) and `completion` where it has that column,
    else the starting policy's greedy answer of at most `max_completion_length` tokens (rows whose answer is empty
    are left out). They are tokenized at the first train begin and kept in every checkpoint (`state_dict`), so that a
    resumed run measures the same texts. The starting policy is TRL's reference (`start_policy`), which the configs
    keep equal to it (no resets, no `sync_ref_model`). Every process scores its shard and the sums are reduced.
    """

    def __init__(self, trainer, dataset):
        args = trainer.args
        columns = getattr(dataset, "column_names", None)
        if not isinstance(columns, list) or "prompt" not in columns:
            got = "None" if dataset is None else f"a {type(dataset).__name__} with columns {columns}"
            raise ValueError(
                "kl_controller='drift' measures the drift on held-out texts: pass eval_dataset, a Dataset with a "
                "'prompt' column (and a 'completion' column to score those texts; without it the starting policy's "
                f"greedy answers to the prompts are scored), got {got}."
            )
        rows = dataset.select(range(min(args.drift_samples, len(dataset))))
        self.trainer, self.every = trainer, args.drift_every
        self.prompts = list(rows["prompt"])
        self.completions = list(rows["completion"]) if "completion" in columns else None
        self.rows: list[tuple[list[int], list[int]]] | None = None  # tokenized at the first train begin

    def state_dict(self) -> list:
        return [[list(p), list(c)] for p, c in self.rows] if self.rows is not None else None

    def load_state_dict(self, rows: list) -> None:
        if not (isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == 2 for r in rows)):
            raise ValueError(f"Invalid saved drift texts: expected a list of [prompt ids, completion ids]: {rows}.")
        self.rows = [(list(p), list(c)) for p, c in rows]

    def _tokenized_rows(self) -> list[tuple[list[int], list[int]]]:
        trainer = self.trainer
        tokenizer = trainer.processing_class
        texts, add_special_tokens = prompt_texts(tokenizer, self.prompts)
        completions = self.completions
        if completions is None:  # the starting policy's greedy answers
            policy = trainer.accelerator.unwrap_model(trainer.model)
            with start_policy(policy, trainer.ref_model) as start:
                completions = generate(start, tokenizer, self.prompts, trainer.args.max_completion_length)
        rows = []
        for text, completion in zip(texts, completions, strict=True):
            prompt_ids, completion_ids = prompt_and_completion_ids(tokenizer, text, completion, add_special_tokens)
            if prompt_ids and completion_ids:
                rows.append((prompt_ids, completion_ids))
        if not rows:
            raise ValueError(
                f"kl_controller='drift': none of the {len(texts)} held-out texts (eval_dataset) has a prompt and a "
                "completion with a token, so no drift can be measured."
            )
        return rows

    def measure(self) -> float:
        """The policy's drift now (a collective: every process calls it)."""
        trainer = self.trainer
        accelerator, tokenizer = trainer.accelerator, trainer.processing_class
        policy = accelerator.unwrap_model(trainer.model)
        indices, weights = shard_rows(accelerator, len(self.rows))
        kl = tokens = 0.0
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad(), accelerator.autocast():
                for start in range(0, len(indices), DRIFT_BATCH_SIZE):
                    batch = [self.rows[i] for i in indices[start : start + DRIFT_BATCH_SIZE]]
                    logps = completion_log_probs(policy, batch, tokenizer)
                    with start_policy(policy, trainer.ref_model) as reference:
                        start_logps = completion_log_probs(reference, batch, tokenizer)
                    for weight, p, q in zip(weights[start : start + DRIFT_BATCH_SIZE], logps, start_logps):
                        kl += weight * (p.exp() * (p - q)).sum().double().item()  # Σ_t Σ_v p (log p − log q)
                        tokens += weight * len(p)
        finally:
            policy.train(was_training)
        kl, tokens = sum_over_processes(accelerator, [kl, tokens])
        return kl / tokens

    def on_train_begin(self, args, state, control, **kwargs):
        if self.rows is None:  # a resumed run has the checkpoint's (`AdaptiveKLStateCallback`)
            self.rows = self._tokenized_rows()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every and step < state.max_steps:
            return
        drift = self.measure()
        controller = self.trainer.beta_controller
        controller.update(step, drift=drift)
        metrics = metric_store(self.trainer, "train")
        metrics["adaptive_kl/drift"].append(drift)
        metrics["adaptive_kl/drift_target"].append(
            drift_path(step, target_drift=controller.target_drift, max_steps=controller.max_steps)
        )
