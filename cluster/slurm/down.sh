#!/usr/bin/env bash
# Stop the cluster cluster/slurm/up.sh started in DIR and remove DIR.
#
#   cluster/slurm/down.sh [--keep] [DIR]    # --keep: leave DIR (logs) in place
#
# Cancels the cluster's jobs (so no job processes outlive it), then stops slurmd, slurmctld and
# munged: exactly the processes named by DIR's PID files, each checked by name first, never by a
# broad match. Running it on a cluster that is already down does nothing.
set -euo pipefail

KEEP=0
if [ "${1:-}" = "--keep" ]; then KEEP=1; shift; fi
DIR="${1:-${WAGMA_SLURM_DIR:-${TMPDIR:-/tmp}/wagma-slurm}}"
MARK=.wagma-slurm

die() { echo "cluster/slurm/down.sh: error: $*" >&2; exit 1; }

if [ ! -e "$DIR" ]; then
    echo "cluster/slurm/down.sh: nothing to stop: $DIR does not exist"
    exit 0
fi
[ -f "$DIR/$MARK" ] || die "$DIR was not made by cluster/slurm/up.sh (no $MARK in it); not touching it"

pid_of() {  # pid_of NAME: the PID in DIR/run/NAME.pid when that process is NAME, else nothing
    local pid
    pid="$(cat "$DIR/run/$1.pid" 2>/dev/null)" || return 0
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]; then echo "$pid"; fi
}

export SLURM_CONF="$DIR/etc/slurm.conf"
if [ -n "$(pid_of slurmctld)" ] && command -v squeue >/dev/null 2>&1; then
    jobs="$(squeue -h -o %A 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        # KillWait (30 s) is what SLURM gives a job between SIGTERM and SIGKILL.
        for _ in $(seq 1 80); do
            [ -z "$(squeue -h -o %A 2>/dev/null || true)" ] && break
            sleep 0.5
        done
    fi
fi

stop() {  # stop NAME: TERM, up to 10 s, then KILL
    local pid
    pid="$(pid_of "$1")"
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        [ -d "/proc/$pid" ] || return 0
        sleep 0.2
    done
    echo "cluster/slurm/down.sh: $1 ($pid) ignored SIGTERM for 10 s: killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
}
stop slurmd
stop slurmctld
stop munged

if [ "$KEEP" = 0 ]; then
    rm -rf "$DIR"
    echo "cluster/slurm/down.sh: stopped and removed $DIR"
else
    echo "cluster/slurm/down.sh: stopped; logs kept in $DIR/log"
fi
