#!/usr/bin/env bash
# One GPU machine's checks and measurements for the open GPU questions, in the order of what they
# settle, within a wall-time budget (GPU time comes in short slots):
#
#   DEADLINE=525 bash benchmarks/gpu_check.sh OUT [WHEELS]
#
# WHEELS (optional): a folder of wheels to install first into this Python (mpich, mpi4py,
# gymnasium, farama-notifications, where the machine has torch but not those); the project is then
# installed editable (its native engine built). Without it the project must already be installed.
# The wheels for a Python 3.12 x86-64 machine, fetched on any machine with pip:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl mpich==5.0.2 mpi4py==4.1.2 gymnasium==1.4.0 farama-notifications==0.0.6
#
# Steps (each under its share of what is left; a step that fails or runs out is logged and the
# next one runs; skipped with less than 20 s left):
#   tests    the CUDA tests: the graphed policy step first, then the batch simulator, the device
#            rollout and the optimizers' GPU path (they skip on a machine without CUDA)
#   node     AllreduceSGD's exchange='node' cases at 4 ranks, and how many ranks printed torch's
#            "Producer process has been terminated" warning at exit (0 expected since NodeSum.close
#            releases the peers' buffers first)
#   optim    ResNet-50 at 4 ranks on the GPU: no averaging, AllreduceSGD node, WAGMA, WAGMA in the
#            background, with MPICH's single-copy transfers as the ranks chose them
#            (mpi_single_copy says); then no averaging and the two WAGMA rows with it off
#   ddppo    DD-PPO's policy, 1 x 256, 16,384-frame mini-batches, eagerly and with
#            rollout.cuda_graph=true
#   success  make train's job to success 0.8 at 4 x 32 with 16-step rollouts, graphed
#   default  the default policy at 4 x 128, eagerly and graphed
#   ddppo    the DD-PPO pair again, where the budget allows
#
# Everything goes to OUT/steps.log (each step's command, exit status, seconds and output tail) and
# the raw files to OUT/results.tgz (packed at the end, also when the budget runs out).
set -u
OUT=${1:?usage: DEADLINE=seconds bash benchmarks/gpu_check.sh OUT [WHEELS]}
WHEELS=${2:-}
DEADLINE=${DEADLINE:-525}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
WORK=$(mktemp -d)
mkdir -p "$OUT"
LOG="$OUT/steps.log"
export PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1

pack() { tar czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null; }
trap pack EXIT

left() { echo $((DEADLINE - ($(date +%s) - START))); }
say() { echo "$*" | tee -a "$LOG"; }

# step NAME SECONDS COMMAND...: run COMMAND with at most SECONDS (and never past the budget).
step() {
    local name=$1 want=$2 t s rc
    shift 2
    t=$(left)
    if ((t < 20)); then
        say "== $name: skipped ($t s left)"
        return 0
    fi
    ((want > t - 10)) && want=$((t - 10))
    say "== $name (at most $want s): $*"
    s=$(date +%s)
    timeout -k 5 "$want" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    say "== $name: exit $rc after $(($(date +%s) - s)) s"
    tail -n 30 "$WORK/$name.log" >>"$LOG"
    return $rc
}

say "gpu_check: $(date -u +%FT%TZ), budget $DEADLINE s, $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo dirty)"
if [ -n "$WHEELS" ]; then
    step install 120 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile '$WHEELS'/*.whl &&
        python3 -m pip install -q --no-build-isolation --no-deps -e ." || exit 1
fi
PY=$(command -v python3)
MPIEXEC=$(dirname "$PY")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)
LIBMPI=$("$PY" -c 'import sys; print(sys.prefix)')/lib/libmpi.so.12
[ -e "$LIBMPI" ] && export MPI4PY_LIBMPI=$LIBMPI # the wheel's MPICH, not a system MPI
say "python $PY, mpiexec $MPIEXEC, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

step tests 120 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_graphed.py \
    tests/test_envs_device.py tests/test_trainer_device.py tests/test_optim_gpu_path.py \
    -k "cuda or compile or graph"
tests=$?

step node 60 "$MPIEXEC" -n 4 "$PY" -m pytest -q -p no:cacheprovider tests/mpi/optim_node_cases.py -k cuda
say "node: ranks that warned 'Producer process has been terminated': $(grep -c 'Producer process has been terminated' "$WORK/node.log")"

step optim 80 "$MPIEXEC" -n 4 "$PY" benchmarks/optim_gpu.py --device cuda --seconds 8 \
    --rows none,allreduce_node,wagma,wagma_bg --json "$WORK/optim_gpu.json"
step optim_cma_off 50 env MPIR_CVAR_CH4_CMA_ENABLE=0 "$MPIEXEC" -n 4 "$PY" benchmarks/optim_gpu.py \
    --device cuda --seconds 8 --rows none,wagma,wagma_bg --json "$WORK/optim_gpu_cma_off.json"

if ((tests != 0)); then
    say "the CUDA tests failed: no graphed runs"
    exit 1
fi
DDPPO=(--parts training --only "DD-PPO policy, 1 x 256, bf16" --cap 60 --mpiexec "$MPIEXEC")
ddppo() { # ddppo ROUND: DD-PPO's policy eagerly, then graphed
    step "ddppo_eager_$1" 75 "$PY" benchmarks/gpu.py "${DDPPO[@]}" \
        --extra ppo.num_mini_batch=2 --out "$WORK/ddppo_eager_$1"
    step "ddppo_graph_$1" 75 "$PY" benchmarks/gpu.py "${DDPPO[@]}" \
        --extra ppo.num_mini_batch=2 rollout.cuda_graph=true --out "$WORK/ddppo_graph_$1"
}
ddppo 1

step success 110 "$PY" benchmarks/gpu.py --parts success --only "4 x 32, 16 steps" \
    --extra rollout.cuda_graph=true --mpiexec "$MPIEXEC" --out "$WORK/success_graph"

for mode in eager graph; do
    extra=()
    [ $mode = graph ] && extra=(--extra rollout.cuda_graph=true)
    step "default_$mode" 50 "$PY" benchmarks/gpu.py --parts training \
        --only "default policy, 4 x 128, bf16" --cap 40 --mpiexec "$MPIEXEC" "${extra[@]}" \
        --out "$WORK/default_$mode"
done

ddppo 2 # a second pair where the budget allows (the runs vary by 10-20% on one machine)
say "gpu_check: done, $(left) s of the budget left"
