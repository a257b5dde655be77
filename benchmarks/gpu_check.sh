#!/usr/bin/env bash
# The GPU checks in one device call: adaptive-kl on Unsloth's real kernels (parity with Unsloth's own β loss, every KL
# method trains without NaN, step time and peak VRAM against Unsloth's and TRL's stock trainers). See gpu_check.py.
#
# On a GPU machine (the `device` tool), from the project root, after `bash ../shared/gpu/wheelhouse.sh` here:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"])
#   The wheels in .whl/ (Unsloth, unsloth_zoo, TRL 1.15, ...) are installed into /tmp/site first; the report goes to
#   $OUT/gpu-check.md (it comes back with the call) unless --output is given. About 5-8 minutes on an H100.
# On a CPU, the same path on the tiny model (the test suite runs it, in the environment that has Unsloth):
#     bash benchmarks/gpu_check.sh --dry-run --output /tmp/gpu-check.md
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# Unsloth writes its generated trainers, and inductor its kernels, to these: private to this run.
work=$(mktemp -d)
export UNSLOTH_COMPILE_LOCATION="$work/unsloth_compiled_cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING=0
args=("$@")
if [[ " $* " != *" --output "* ]]; then
  args+=(--output "${OUT:-benchmarks/results}/gpu-check.md")
fi
exec "$python" benchmarks/gpu_check.py "${args[@]}"
