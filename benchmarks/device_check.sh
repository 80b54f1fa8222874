#!/usr/bin/env bash
# The check to run when a CUDA GPU is at hand (`make test-cuda`); under 8 minutes on one GPU.
#
#   1. the CUDA tests: every test marked `cuda` under tests/ (pytest -m cuda): every loss, with each strategy,
#      and every metric class on CUDA tensors at one process with an NCCL process group and at two processes
#      on the one GPU with gloo (where gloo takes CUDA tensors), states and results on the device, a steady
#      loss step that never waits for the GPU, and the autocast checks on CUDA;
#   2. the host-round-trip counter, tests/unittests/reliability/test_host_round_trips.py, when the checkout has it;
#   3. benchmarks/bench_device.py: CLIP and SigLIP against open_clip on the GPU, one markdown table to paste
#      into the docs.
#
# Without CUDA it prints one line saying so and exits 0. PY is the interpreter (default python3; make test-cuda
# passes the venv's); it needs torch built with CUDA, pytest and pytest-timeout, and open_clip_torch for the
# anchor columns of the table. Exit status: 0 when every part passed, 1 otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
PY="${PY:-python3}"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "device check skipped: no CUDA device here ($PY: torch.cuda.is_available() is not True)"
    exit 0
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$SECONDS
failed=()

part() {  # part NAME SECONDS COMMAND...: run COMMAND with a time limit, remember NAME if it fails
    local name=$1 limit=$2
    shift 2
    echo
    echo "== $name (at most ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" || failed+=("$name (exit $?)")
}

"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")'
part "CUDA tests" 240 "$PY" -m pytest -q -m cuda tests --continue-on-collection-errors
counter=tests/unittests/reliability/test_host_round_trips.py
if [ -f "$counter" ]; then
    part "host round trips" 100 "$PY" -m pytest -q "$counter"
else
    echo
    echo "== host round trips: $counter is not in this checkout"
fi
part "loss benchmark" 90 "$PY" benchmarks/bench_device.py

echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "device check passed in $((SECONDS - started))s"
    exit 0
fi
echo "device check FAILED in $((SECONDS - started))s: ${failed[*]}"
exit 1
