#!/usr/bin/env bash
# The resume check on the real model (SmolLM2-135M-Instruct, LoRA r16), from the repository root:
#   bash docs/studies/real/methods/pilots/resume-check/check.sh [OUT]      (~17 min on one core)
# The same 5-step command three times: uninterrupted without checkpoints; with a checkpoint every 3 steps, killed
# (SIGKILL, tests/compare_worker.py) at the end of step 4; then resumed with --resume from checkpoint-3. Prints every
# value of runs.json that differs between the uninterrupted and the resumed run, other than the times.
set -euo pipefail
out="${1:-resume-check}"
ARGS=(compare --model smollm2 --steps 5 --eval-every 2 --n-validation 4 --set max_completion_length=128
      --set "reward_weights=[1.0, 0.0]" --variant "beta=0.2 loss_type=grpo kl_adaptation_method=clip" --seed 0
      --no-progress)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
python -m adaptive_kl "${ARGS[@]}" --out "$out/uninterrupted"
status=0
KILL_AT_STEP=4 python tests/compare_worker.py "${ARGS[@]}" --save-every 3 --out "$out/resumed" || status=$?
[ "$status" -eq 137 ] || { echo "the run was not killed (exit $status)"; exit 1; }
python -m adaptive_kl "${ARGS[@]}" --save-every 3 --resume --out "$out/resumed"
python - "$out" <<'PY'
import json, sys
TIMES = {"step_time", "wall_time", "resumed_at"}
(a,), (b,) = (json.load(open(f"{sys.argv[1]}/{name}/runs.json")) for name in ("uninterrupted", "resumed"))
differ = [k for k in a if k not in TIMES | {"history"} and a[k] != b[k]]
differ += [f"history step {x['step']}: {k}" for x, y in zip(a["history"], b["history"], strict=True)
           for k in set(x) | set(y) if k not in TIMES and x.get(k) != y.get(k)]
print(f"resumed at {b['resumed_at']}; values that differ: {differ or 'none'}")
sys.exit(1 if differ else 0)
PY
