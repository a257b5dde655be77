"""`RunWarnings`: the warnings a trainer gives at most once per run.

A condition that can recur at every step (a reward function returning ±inf, a β update skipped on a non-finite
statistic) is worth telling once, not once per step; a new `train()` call tells it again.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field


@dataclass
class RunWarnings:
    """`UserWarning`s given at most once per `train()` call each, by the main process only (every process sees the same
    reduced statistics, so the others would repeat it).

    Args:
        is_main_process (`bool`): whether this process gives them.
        given (`set[str]`): the keys of the warnings given in this run.
    """

    is_main_process: bool
    given: set[str] = field(default_factory=set)

    def warn(self, key: str, message: str) -> None:
        """Gives `message` unless the warning `key` was given in this run."""
        if key not in self.given:
            self.given.add(key)
            if self.is_main_process:
                warnings.warn(message, UserWarning, stacklevel=4)  # past this and the collaborator that warns

    def start_run(self) -> None:
        """A new `train()` call: every warning may be given again."""
        self.given.clear()
