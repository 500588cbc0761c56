#!/usr/bin/env bash
# Builds the C stress driver (native_coll/tests/coll_stress.c) under AddressSanitizer and under
# ThreadSanitizer with the venv's MPI, and runs each at 4 ranks (blocking globals, overlapped
# globals, the node-aware schedule on pretended nodes, and globals on the 16-bit wire).
# `make sanitize` calls this.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
MPICC=${MPICC:-$VENV/bin/mpicc}
MPIEXEC=${MPIEXEC:-$VENV/bin/mpiexec}
RANKS=${RANKS:-4}
ITERS=${ITERS:-400}
out=build/sanitize
mkdir -p "$out"
# Every engine source, i.e. all of native_coll/src but the Python binding (CMakeLists.txt lists them).
src=(native_coll/tests/coll_stress.c)
for f in native_coll/src/*.c; do [[ $f == */binding.c ]] || src+=("$f"); done
# MPICH itself is not instrumented: its own allocations at exit are not ours to report.
echo "leak:libmpi" > "$out/lsan.supp"
# UCX (MPICH's netmod) hooks mmap/madvise and reads peers' memory with process_vm_readv; both
# clash with the sanitizers' interceptors (crashes inside UCX, not in our code), so turn them off.
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_TLS=^cma
# One case at $RANKS ranks; each rank's output kept in $out/logs (a rank that ends silently, e.g.
# killed from outside, still leaves what it printed): on a failure, mpiexec's status and the end
# of every rank's output, then exit 1.
run_case() {  # name, then environment assignments and the driver's arguments after --
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  mkdir -p "$out/logs"; rm -f "$out/logs/$name".*
  local rc=0
  env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$PWD/$out/lsan.supp \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "${envs[@]}" \
    "$MPIEXEC" -n "$RANKS" -outfile-pattern "$out/logs/$name.%r.out" \
    -errfile-pattern "$out/logs/$name.%r.err" "$out/coll_stress_$san" "$@" || rc=$?
  if (( rc != 0 )); then
    echo "sanitizers: $name failed (mpiexec exit $rc)"
    for f in "$out/logs/$name".*; do echo "--- $f ($(wc -c <"$f") bytes)"; tail -n 40 "$f"; done
    exit 1
  fi
  local logs=("$out/logs/$name".*)  # (a rank that printed nothing leaves no file)
  (( ${#logs[@]} == 0 )) || cat "${logs[@]}"
}
for san in address thread; do
  echo "== $san"
  "$MPICC" -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=$san \
    -Werror=implicit-function-declaration \
    -Inative_coll/src "${src[@]}" -o "$out/coll_stress_$san" -lpthread -lm
  run_case "$san-blocking" -- "$ITERS"
  run_case "$san-overlap" -- "$((ITERS / 2))" overlap
  # The node-aware schedule: pretend 2 ranks per node, every group (of 4) across two nodes.
  run_case "$san-nodes" WA_NODE_SIZE=2 WA_HIER_MIN_BYTES=0 -- "$((ITERS / 2))" blocking 4
  # Globals on the 16-bit wire (pack buffers, 16-bit receives), blocking and overlapped.
  for wire in bf16 fp16; do
    mode=blocking; [[ $wire == fp16 ]] && mode=overlap
    run_case "$san-$wire" -- "$((ITERS / 2))" $mode 2 $wire
  done
done
echo "sanitizers: clean"
