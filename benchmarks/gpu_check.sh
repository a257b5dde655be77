#!/usr/bin/env bash
# The GPU check in one device call: adaptive-kl on Unsloth's real kernels, a verdict per check as each finishes
# (parity of the KL contribution for every loss type, every KL method training, steps_per_generation, evaluation,
# reference resets, 4-bit, the β formula, then step time and peak VRAM against Unsloth's and TRL's stock trainers).
# See gpu_check.py for the checks, and docs/unsloth.md for each check's time on an H100.
#
# On a GPU machine (the `device` tool), from the project root, after `bash ../shared/gpu/wheelhouse.sh` here:
#     run(command="bash benchmarks/gpu_check.sh --wheels", carry=[".whl"])
#   With --wheels, the wheels in .whl/ (Unsloth, unsloth_zoo, TRL 1.15, bitsandbytes, ...) are installed first, into a
#   directory private to this run (put first on PYTHONPATH); without it, the current environment is used as it is. The
#   report goes to $OUT/gpu-check.md (it comes back with the call, even one cut short) unless --output is given; each
#   check appends to it as it ends. No check starts once --budget seconds have passed since the script started (default
#   480, inside the call's 600): a second call runs the skipped ones and cost-trl, on an H100
#   `bash benchmarks/gpu_check.sh --only parity-long,train,beta,steps,evaluation,reference,4bit,cost-trl`.
#   Exit status: 0 no check failed, 1 one failed, 2 the preflight failed (the reason is the last line).
# On a CPU, the same path on the tiny model (the test suite runs it, in the environment that has Unsloth):
#     bash benchmarks/gpu_check.sh --dry-run --output /tmp/gpu-check.md
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# Unsloth writes its generated trainers, and inductor its kernels, to these: private to this run, as are the wheels.
work=$(mktemp -d)
args=()
site=""
for arg in "$@"; do
  if [[ "$arg" == "--wheels" ]]; then
    compgen -G ".whl/*.whl" >/dev/null || { echo "gpu_check.sh: --wheels, but .whl/ has no wheels (run bash ../shared/gpu/wheelhouse.sh)" >&2; exit 2; }
    site="$work/site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  else
    args+=("$arg")
  fi
done
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export UNSLOTH_COMPILE_LOCATION="$work/unsloth_compiled_cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING=0
if [[ " ${args[*]-} " != *" --output "* ]]; then
  args+=(--output "${OUT:-benchmarks/results}/gpu-check.md")
fi
exec "$python" benchmarks/gpu_check.py ${args[@]+"${args[@]}"}
