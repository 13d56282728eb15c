#!/usr/bin/env bash
# GPU readiness check: HF engine on CUDA, FSDP2 learner over NCCL (world size 1), one RTPO iteration on a
# random-weight ~0.5B Qwen3 with the real tokenizer -> bench/gpu_check.json (generation tokens/s, learner
# MFU, the iteration's time split).  See bench/gpu_check.py.
#
# The GPU host needs only Python with torch (CUDA) and transformers preinstalled; nothing is downloaded
# there.  Everything else travels as wheels:
#
#   1. on a machine with a package index, same Python minor version and platform as the GPU host:
#        bench/gpu_check.sh --make-wheelhouse wheelhouse/
#      (rtpo's own wheel plus every dependency of rtpo[llm] except torch and transformers:
#       pip wheel --no-deps . && pip download of the rest, binary wheels only)
#   2. copy the repository and wheelhouse/ to the GPU host, then there:
#        bench/gpu_check.sh --wheelhouse wheelhouse/        # pip install --no-index from it, then the check
#        bench/gpu_check.sh                                  # when rtpo[llm] is installed already
#   --dry-run runs the same code on CPU with a tiny model (tests/test_gpu_check.py runs it).
#   Any further arguments go to bench/gpu_check.py (--out FILE, --peak-tflops X, --max-tokens N).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-python}"
wheelhouse=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --make-wheelhouse)
      dest="$2"; mkdir -p "$dest"
      "$py" -m pip wheel --no-deps -w "$dest" "$root"
      deps="$("$py" - "$root/pyproject.toml" <<'PY'
import re, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = p["dependencies"] + p["optional-dependencies"]["llm"]
skip = {"torch", "transformers"}  # preinstalled on the GPU host
print("\n".join(r for r in reqs if re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() not in skip))
PY
)"
      # shellcheck disable=SC2086
      echo "$deps" | xargs -d '\n' "$py" -m pip download --only-binary=:all: -d "$dest"
      echo "wheelhouse ready in $dest"
      exit 0 ;;
    --wheelhouse) wheelhouse="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -n "$wheelhouse" ]; then
  "$py" -m pip install --no-index --find-links "$wheelhouse" "rtpo[llm]"
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0
cd "$root"
exec "$py" "$here/gpu_check.py" "${args[@]}"
