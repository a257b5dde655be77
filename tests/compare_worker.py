"""`adaptive-kl compare ...` killed (SIGKILL) at the end of an optimizer step, after its model update and before that
step's checkpoint: `KILL_AT_STEP=N python tests/compare_worker.py compare ...`.

The process dies as a preempted job does: no exception handler, no `on_train_end`, no report, nothing flushed.
`tests/demo/test_resume.py` resumes what it left behind with `--resume`.
"""

from __future__ import annotations

import os
import signal
import sys

from adaptive_kl.demo import runner


KILL_AT_STEP = int(os.environ["KILL_AT_STEP"])


class KillAtStep(runner.VariantProgressCallback):
    """The demo's progress callback, which also kills the process at the end of step `KILL_AT_STEP`."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == KILL_AT_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().on_step_end(args, state, control, **kwargs)


if __name__ == "__main__":
    runner.VariantProgressCallback = KillAtStep  # run_variant builds its progress callback from the module's name

    from adaptive_kl.console import main

    main(sys.argv[1:])
    raise SystemExit(f"the run was not killed at step {KILL_AT_STEP}")
