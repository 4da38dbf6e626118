#!/usr/bin/env bash
# Device check of psnode.torch on CUDA: one prepared script, under 5 minutes on one H200.
#
# What it checks (each line of the summary says PASS, FAIL or SKIP and why):
#   1. pytest: the CPU tests of psnode.torch (tests/unit/test_torch_wrapper.py,
#      tests/cluster/test_torch_trainer.py) and the CUDA tests (tests/gpu: CUDA models against
#      CPU ones, the hook pipeline on CUDA, no device allocation in step(), float32 master
#      weights for bf16/fp16, the closed-form fp32 + bf16 job with 2 workers sharing the GPU and
#      2 servers, host_value/scatter with one tensor per GPU, the MLP and NCCL examples).
#   2. the digits MLP through `mxdist launch -n 2 -s 2` on the CPU, then on cuda with the two
#      workers sharing the GPU: the cuda accuracy within 1 point of the CPU run's.
#   3. the seed's NCCL snippet as one rank: `mxdist launch -n 1 -s 0 examples/ddp_nccl.py`.
#   4. the D2H/push overlap: tests/gpu/overlap_bench.py under `mxdist launch -n 1 -s 1` and
#      `-n 2 -s 2` (step time against compute alone; see that file for the figures).
#   5. the launcher on a GPU host: preflight's GPU report (nvidia-smi), `--gpus-per-worker 1`
#      with `--pass-local-rank` running the NCCL snippet, and the refusal when a host has fewer
#      GPUs than its workers ask for (exit 3, nothing started).
# Without CUDA (e.g. on a CI-like machine) the CPU parts run and every CUDA part says SKIP.
#
# mxdist features used: local launches (-n, -s, -s 0), the LOCAL_RANK each worker gets, and in
# step 5 --gpus-per-worker, --pass-local-rank and GPU preflight.  Devices: the examples map
# LOCAL_RANK to cuda:(LOCAL_RANK % visible GPUs), so 2 workers share a single GPU.
#
# The GPU machine has Python 3.12 with CUDA PyTorch, numpy, typer, rich, pytest, scikit-learn,
# no network and no pyzmq/paramiko.  Carry their wheels in the git-ignored .whl/ folder at the
# repository root, filled on a machine with network (exactly these, one version each):
#   echo /.whl/ >> .git/info/exclude    # .gitignore lists it already
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
#     --platform manylinux_2_31_x86_64 -d .whl pyzmq==27.3.0 paramiko==5.1.0 bcrypt==5.0.0 \
#     cryptography==48.0.0 pynacl==1.6.2 cffi==2.0.0 pycparser==3.0 invoke==3.0.3
# (about 8 MB).  Then on the GPU machine, from the repository root (device tool: carry [".whl"]):
#   bash tests/gpu/device_check.sh
# Logs go to $OUT (the device tool's folder) or /tmp/device-check; exit status 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp/device-check}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 MXDIST_HOME=${MXDIST_HOME:-/tmp/device-check-mxdist}
T0=$(date +%s)

if ! "$PY" -c "import zmq, paramiko" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "pyzmq/paramiko are missing and .whl/ is empty: see this file's header"; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/device-check-site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/device-check-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

SUMMARY=()
FAILED=0
say() { echo "== $*"; }
result() {  # result STATUS NAME DETAIL
    SUMMARY+=("$(printf '%-4s %-44s %s' "$1" "$2" "$3")")
    [ "$1" = FAIL ] && FAILED=1
    say "$1 $2 $3"
}
mxdist() { timeout "$1" "$PY" -m mxdist launch "${@:2}"; }
accuracy() { grep -o 'accuracy=[0-9.]*' "$1" | tail -1 | cut -d= -f2; }

"$PY" - <<'EOF' | tee "$LOGS/env.log"
import platform, numpy, torch
print(f"python {platform.python_version()} torch {torch.__version__} numpy {numpy.__version__} "
      f"cuda_available={torch.cuda.is_available()} devices={torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} {torch.cuda.get_device_name(i)}")
EOF
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
NOCUDA="skipped: CUDA is not available (torch.cuda.is_available() is False)"

# 1. pytest -------------------------------------------------------------------------------
say "pytest (CPU tests of psnode.torch, CUDA tests in tests/gpu)"
timeout 170 "$PY" -m pytest -q -rs -p no:cacheprovider tests/unit/test_torch_wrapper.py \
    tests/cluster/test_torch_trainer.py tests/gpu 2>&1 | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
line=$(grep -E '^[0-9]+ (passed|failed|skipped)|[0-9]+ passed|[0-9]+ skipped' "$LOGS/pytest.log" | tail -1)
if [ "$rc" = 0 ]; then result PASS pytest "$line"; else result FAIL pytest "rc=$rc $line"; fi
if [ "$CUDA" = 1 ] && grep -q "CUDA is not available" "$LOGS/pytest.log"; then
    result FAIL "pytest cuda tests" "skipped although CUDA is available"
fi

# 2. the digits MLP: CPU run, then cuda with 2 workers sharing the GPU -----------------------
say "mlp_torch W=2 S=2 on the CPU"
mxdist 120 -n 2 -s 2 examples/mlp_torch.py --epochs 10 2>&1 | tee "$LOGS/mlp_cpu.log"
cpu_acc=$(accuracy "$LOGS/mlp_cpu.log")
if [ -n "$cpu_acc" ]; then result PASS "mlp_torch cpu W2 S2" "accuracy=$cpu_acc"; else result FAIL "mlp_torch cpu W2 S2" "no accuracy line"; fi
if [ "$CUDA" = 1 ]; then
    say "mlp_torch W=2 S=2 on cuda (the workers share the GPU)"
    mxdist 120 -n 2 -s 2 examples/mlp_torch.py --epochs 10 --device cuda 2>&1 | tee "$LOGS/mlp_cuda.log"
    gpu_acc=$(accuracy "$LOGS/mlp_cuda.log")
    devs=$(grep -o 'worker [01]: device=[a-z0-9:]*' "$LOGS/mlp_cuda.log" | sort | tr '\n' ' ')
    if [ -n "$gpu_acc" ] && [ -n "$cpu_acc" ] && "$PY" -c "import sys; sys.exit(abs($gpu_acc - $cpu_acc) > 0.01)"; then
        result PASS "mlp_torch cuda W2 S2 vs cpu" "cuda accuracy=$gpu_acc cpu accuracy=$cpu_acc ($devs)"
    else
        result FAIL "mlp_torch cuda W2 S2 vs cpu" "cuda accuracy=${gpu_acc:-none} cpu accuracy=${cpu_acc:-none}"
    fi
else
    result SKIP "mlp_torch cuda W2 S2 vs cpu" "$NOCUDA"
fi

# 3. the seed's NCCL snippet, one rank (CPU counterpart: the gloo snippet) ------------------
if [ "$CUDA" = 1 ]; then
    say "ddp_nccl.py, 1 rank, -s 0"
    mxdist 120 -n 1 -s 0 examples/ddp_nccl.py --epochs 3 --mode param 2>&1 | tee "$LOGS/nccl.log"
    acc=$(accuracy "$LOGS/nccl.log")
    if grep -q "backend=nccl world_size=1" "$LOGS/nccl.log" && [ -n "$acc" ]; then
        result PASS "ddp_nccl 1 rank" "accuracy=$acc"
    else
        result FAIL "ddp_nccl 1 rank" "see $LOGS/nccl.log"
    fi
else
    result SKIP "ddp_nccl 1 rank" "$NOCUDA"
    mxdist 120 -n 1 -s 0 examples/ddp_gloo.py --epochs 2 --device cpu 2>&1 | tee "$LOGS/gloo.log"
    acc=$(accuracy "$LOGS/gloo.log")
    if [ -n "$acc" ]; then result PASS "ddp_gloo 1 rank (cpu counterpart)" "accuracy=$acc"; else result FAIL "ddp_gloo 1 rank (cpu counterpart)" "see $LOGS/gloo.log"; fi
fi

# 4. D2H/push overlap: step time against compute alone -------------------------------------
if [ "$CUDA" = 1 ]; then
    # W=1 S=1 calibrates the batch (compute ~ comm); W=2 S=2 (sharing the GPU) reuses it: several
    # workers must step alike, so they cannot calibrate each on its own
    batch=
    for ws in "1 1" "2 2"; do
        set -- $ws
        say "overlap_bench W=$1 S=$2 on cuda"
        mxdist 150 -n "$1" -s "$2" tests/gpu/overlap_bench.py --device cuda ${batch:+--batch $batch} 2>&1 \
            | tee "$LOGS/overlap_w$1.log"
        fig=$(grep -o 'overlap: .*' "$LOGS/overlap_w$1.log" | tail -1)
        if [ -n "$fig" ]; then result PASS "overlap W$1 S$2 (measured)" "${fig#overlap: }"; else result FAIL "overlap W$1 S$2" "see $LOGS/overlap_w$1.log"; fi
        batch=$(echo "$fig" | grep -o 'batch=[0-9]*' | cut -d= -f2)
        [ -n "$batch" ] || break
    done
else
    result SKIP "overlap on cuda" "$NOCUDA"
    mxdist 150 -n 1 -s 1 tests/gpu/overlap_bench.py --device cpu --hidden 256 --layers 4 --iters 4 \
        --batch-min 64 --batch-max 4096 2>&1 | tee "$LOGS/overlap_cpu.log"
    fig=$(grep -o 'overlap: .*' "$LOGS/overlap_cpu.log" | tail -1)
    if [ -n "$fig" ]; then result PASS "overlap_bench cpu smoke (not a figure)" "${fig#overlap: }"; else result FAIL "overlap_bench cpu smoke" "see $LOGS/overlap_cpu.log"; fi
fi

# 5. the launcher on a GPU host ---------------------------------------------------------------
if [ "$CUDA" = 1 ] && command -v nvidia-smi >/dev/null; then
    ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    say "mxdist launch -n 1 -s 0 --gpus-per-worker 1 --pass-local-rank examples/ddp_nccl.py"
    mxdist 120 -n 1 -s 0 --gpus-per-worker 1 --pass-local-rank examples/ddp_nccl.py --epochs 2 --mode param \
        2>&1 | tee "$LOGS/gpus_per_worker.log"
    acc=$(accuracy "$LOGS/gpus_per_worker.log")
    if grep -q "GPUs on localhost: .*NVIDIA" "$LOGS/gpus_per_worker.log" \
        && grep -q "worker 0 @ localhost: CUDA_VISIBLE_DEVICES=0, LOCAL_RANK 0 -> cuda:0" "$LOGS/gpus_per_worker.log" \
        && grep -q "backend=nccl world_size=1 local_rank=0" "$LOGS/gpus_per_worker.log" && [ -n "$acc" ]; then
        result PASS "gpus-per-worker + pass-local-rank (nccl)" "accuracy=$acc; $(grep -o 'GPUs on localhost: .*' "$LOGS/gpus_per_worker.log" | head -1)"
    else
        result FAIL "gpus-per-worker + pass-local-rank (nccl)" "see $LOGS/gpus_per_worker.log"
    fi
    say "mxdist launch -n $((ngpu + 1)) --gpus-per-worker 1: one worker too many (refused, exit 3)"
    COLUMNS=300 mxdist 60 -n $((ngpu + 1)) -s 0 --gpus-per-worker 1 examples/ddp_nccl.py > "$LOGS/too_many.log" 2>&1
    rc=$?
    if [ "$rc" = 3 ] && tr -s ' │\n' ' ' < "$LOGS/too_many.log" | grep -q "need $((ngpu + 1)) GPUs"; then
        result PASS "too few GPUs refused at preflight" "exit 3: $(grep -o 'has [0-9]* GPUs* [0-9,]*' "$LOGS/too_many.log" | head -1)"
    else
        result FAIL "too few GPUs refused at preflight" "exit $rc, see $LOGS/too_many.log"
    fi
else
    result SKIP "launcher on a GPU host" "$NOCUDA (or no nvidia-smi)"
fi

echo
echo "== summary ($(( $(date +%s) - T0 )) s; logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}" | tee "$LOGS/summary.txt"
exit $FAILED
