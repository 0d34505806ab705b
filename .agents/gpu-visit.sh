#!/usr/bin/env bash
# Kept in .agents/ for the next visit: copy to .gpu/go.sh after `bash ../shared/gpu/prepare.sh`; carry .gpu/extra
# (pytest-timeout's wheel) with each call. The phases below are the second visit's of 2026-11-27 (see cuda-ipc.md).
# One visit's phase on the lent GPU machine (issue 27). Usage: bash .gpu/go.sh PHASE SECONDS
# Stages the carried wheel parts, installs what is complete, runs the phase's steps within SECONDS; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=$1
deadline=$(( $(date +%s) + $2 ))
store=/tmp/fray-gpu
mkdir -p "$store/parts" "$store/done" "$store/site" "$OUT"
shopt -s nullglob
for d in .gpu/c[0-9]*; do cp -n "$d"/* "$store/parts/"; done

install() {  # $1: the big wheel's name; its small companions are the loose wheels staged so far
  local t0=$SECONDS
  for first in "$store"/parts/"$1"-*.whl.part.aa; do
    whl=${first%.part.aa}; cat "$whl".part.* > "$store/$(basename "$whl")"; rm -f "$whl".part.*
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$store/site" \
    "$store"/"$1"-*.whl "$store"/parts/*.whl > "$OUT/install-$1.log" 2>&1
  echo "install $1: rc=$? in $((SECONDS - t0)) s"
  mv "$store"/parts/*.whl "$store/done/" 2>/dev/null; rm -f "$store"/"$1"-*.whl
}

src="$PWD/lib/fray/src:$PWD/backends/ray/src:$PWD/backends/monarch/src"
export PYTHONPATH="$src:$store/site:$(ls "$PWD"/.gpu/extra/*.whl | tr '\n' ':')"
export PATH="$store/site/bin:$PATH" PYTHONUNBUFFERED=1 MONARCH_FILE_LOG=error PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

step() {  # step NAME MAX_SECONDS CMD...: at most MAX_SECONDS, never past the deadline
  local name=$1 max=$2; shift 2
  local left=$(( deadline - $(date +%s) - 8 ))
  (( left < max )) && max=$left
  if (( max < 15 )); then echo "=== $name: skipped, the phase's time is spent"; return; fi
  echo "=== $name (at most ${max}s, $(date +%T))"
  timeout -k 5 "$max" "$@" > "$OUT/$name.log" 2>&1
  echo "=== $name: rc=$? ($(date +%T))"
  grep -E "passed|failed|FAILED|ERROR|Error|error:|p50|->|limits|MiB|copy|n/a|raw|fray-" "$OUT/$name.log" | tail -n 60
}

PYTEST=(python3 -m pytest -p fray.testing.plugin -p pytest_timeout -o timeout=100 -o faulthandler_timeout=80
        -q -rfEs --durations=15 -p no:cacheprovider)
tests() {  # tests BACKEND: tests/gpu's CUDA cases and the suite's GPU assignment cases, on this machine's GPU
  step "tests-$1" "$2" "${PYTEST[@]}" tests/gpu/test_cuda_values.py tests/test_conformance.py \
    "--fray-backend=$1" -k "$1 and (gpu or cuda)"
}
bench() { step "bench-gpu-$1" "$2" python3 benchmarks/bench_gpu.py --backends "$1" --sizes 256 --repeats 7 \
  --warmup 2 --row-seconds 12; }
rlhf() { step "rlhf-$1" "$2" python3 benchmarks/bench_rlhf.py --device cuda --backend "$1" --steps 5; }

rlhf3() { step "rlhf-$1" "$2" python3 benchmarks/bench_rlhf.py --device cuda --backend "$1" --steps 3; }
case "$phase" in
  1)
    nvidia-smi -L
    step tests-in_memory 40 "${PYTEST[@]}" tests/test_conformance.py --fray-backend=in_memory -k "gpu"
    rlhf3 in_memory 60 ;;
  2)
    install torchmonarch
    rlhf3 monarch 100 ;;
  3) ;;
  4)
    install ray
    rlhf3 ray 110
    step bench-gpu-ray 150 python3 benchmarks/bench_gpu.py --backends ray --sizes 256 --repeats 5 --warmup 1 \
      --row-seconds 8 ;;
esac
echo "phase $phase done at $(date +%T)"
