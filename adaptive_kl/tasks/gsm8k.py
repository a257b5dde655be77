"""GSM8K as a dataset of the task: the same prompt format and `answer` column as the embedded problems.

GSM8K's `answer` field is the worked solution, ending in the final number after `####`:

    "She sold 48/2 = <<48/2=24>>24 clips in May.\\n...\\n#### 72"

The loader renames it to `solution` and puts the gold number in `answer`, which is the column `accuracy_reward` reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import datasets

from ..models.paths import looks_like_local_path
from .answers import ANSWER_MARKER, normalize_number
from .problems import format_prompt


_JSON_SUFFIXES = (".jsonl", ".json")
_PARQUET_SUFFIX = ".parquet"
_COLUMNS = ("prompt", "answer", "solution", "question")


def gsm8k_final_answer(solution: str) -> str:
    """The normalized gold number after the last `####` of a GSM8K solution (`"...\\n#### 1,234"` -> `"1234"`).

    Raises:
        ValueError: if the solution has no `####` or what follows it is not a single number.
    """
    if ANSWER_MARKER not in solution:
        raise ValueError(f"GSM8K solution has no '{ANSWER_MARKER}' final-answer marker: {solution[-80:]!r}")
    tail = solution.rsplit(ANSWER_MARKER, 1)[1]
    number = normalize_number(tail)
    if number is None:
        raise ValueError(f"GSM8K final answer after '{ANSWER_MARKER}' is not a single number: {tail.strip()!r}")
    return number


def _read_json(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON Lines file, or of a `.json` file holding one array of rows."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not a JSON object: {error}") from error
    return rows


def _split_file(directory: Path, split: str, name: str) -> Path:
    """The file of `split` in a local GSM8K directory: GitHub's `{split}.jsonl`, or the hub's parquet layout."""
    candidates = [directory / f"{split}{suffix}" for suffix in (*_JSON_SUFFIXES, _PARQUET_SUFFIX)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    # A snapshot of the hub repository: `main/train-00000-of-00001.parquet`, or the same without the config folder.
    for folder in (directory / name, directory):
        shards = sorted(folder.glob(f"{split}-*{_PARQUET_SUFFIX}"))
        if len(shards) == 1:
            return shards[0]
        if len(shards) > 1:
            raise ValueError(f"Several parquet shards for split {split!r} in {folder}; pass one file as `path`.")
    looked_for = ", ".join(candidate.name for candidate in candidates)
    raise FileNotFoundError(
        f"No GSM8K file for split {split!r} in directory {directory} (looked for {looked_for}, "
        f"or {name}/{split}-*{_PARQUET_SUFFIX})"
    )


def _read_local(path: Path, split: str, name: str) -> tuple[list[dict[str, Any]], str]:
    if not path.exists():
        raise FileNotFoundError(f"GSM8K path not found: {path}")
    file = _split_file(path, split, name) if path.is_dir() else path
    if file.suffix in _JSON_SUFFIXES:
        return _read_json(file), str(file)
    if file.suffix == _PARQUET_SUFFIX:
        import pyarrow.parquet as pq  # a dependency of `datasets`

        return pq.read_table(file).to_pylist(), str(file)
    raise ValueError(f"Unsupported GSM8K file {file}: expected .jsonl, .json or .parquet")


def _task_columns(rows: Iterable[Mapping[str, Any]], source: str) -> dict[str, list[str]]:
    columns = {column: [] for column in _COLUMNS}
    for index, row in enumerate(rows):
        missing = {"question", "answer"} - set(row)
        if missing:
            raise ValueError(f"{source}: row {index} lacks GSM8K field(s) {sorted(missing)}")
        try:
            answer = gsm8k_final_answer(row["answer"])
        except ValueError as error:
            raise ValueError(f"{source}: row {index}: {error}") from error
        columns["prompt"].append(format_prompt(row["question"]))
        columns["answer"].append(answer)
        columns["solution"].append(row["answer"])
        columns["question"].append(row["question"])
    return columns


def load_gsm8k(
    split: str = "train", path: str = "openai/gsm8k", name: str = "main", limit: int | None = None
) -> datasets.Dataset:
    """GSM8K as a dataset with columns `prompt`, `answer` (gold number), `solution` (GSM8K's answer text), `question`.

    Args:
        split: split to load (`"train"` or `"test"`).
        path: a hub dataset id, loaded with `datasets.load_dataset(path, name, split=split)`; or a local file in
            GSM8K's format (JSON Lines or a JSON array of `{"question": ..., "answer": "...\\n#### 72"}`, or parquet),
            whose rows are used whatever `split` is; or a local directory holding `{split}.jsonl` (GSM8K's GitHub
            layout), `{split}.json`, `{split}.parquet` or the hub's `{name}/{split}-*.parquet`.
        name: configuration of the hub dataset (`"main"` or `"socratic"`); also the folder of a local hub snapshot.
        limit: keep only the first `limit` examples.

    Raises:
        FileNotFoundError: if a local path (an existing one, or one that cannot be a hub id) is missing.
        ValueError: if an example has no `####` final answer.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be non-negative or None, got {limit}")
    local = Path(path).expanduser()
    # A missing local file should fail as such rather than as a failed hub lookup.
    if local.exists() or looks_like_local_path(path) or path.endswith((*_JSON_SUFFIXES, _PARQUET_SUFFIX)):
        rows, source = _read_local(local, split, name)
        if limit is not None:
            rows = rows[:limit]
    else:
        rows = datasets.load_dataset(path, name, split=split)
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows))))
        source = f"{path} ({name}, {split})"
    # Explicit features keep the schema (all strings) even when `limit=0` leaves no rows to infer it from.
    features = datasets.Features({column: datasets.Value("string") for column in _COLUMNS})
    return datasets.Dataset.from_dict(_task_columns(rows, source), features=features)
