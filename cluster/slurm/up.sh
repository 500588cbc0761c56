#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (Debian's slurm-wlm + munge), for tests and trials.
#
#   cluster/slurm/up.sh [DIR]        # default DIR: $WAGMA_SLURM_DIR or ${TMPDIR:-/tmp}/wagma-slurm
#   . DIR/env.sh                     # sets SLURM_CONF so sinfo/srun/sbatch talk to this cluster
#   cluster/slurm/down.sh [DIR]      # stops exactly the daemons started here and removes DIR
#
# Needs root: it installs slurm-wlm and munge with apt-get when they are missing, and slurmd
# starts jobs as their users. Settings (environment): WAGMA_SLURM_CPUS (CPUs the node declares,
# default 4, whatever the machine has), WAGMA_SLURM_PORT (slurmctld's port, slurmd takes the next;
# default: two free ports). Its own munged, key, config, spool, logs and PID files all live in
# DIR, so a system SLURM or another such cluster is left alone. Running it again on a cluster that
# is up does nothing; on a half-started one it stops what is left and starts afresh.
#
# Exit status: 0 up, 3 this machine cannot run it (not root, no apt-get, package mirror
# unreachable: callers such as the tests skip on 3), 1 anything else (a daemon did not start).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${1:-${WAGMA_SLURM_DIR:-${TMPDIR:-/tmp}/wagma-slurm}}"
CPUS="${WAGMA_SLURM_CPUS:-4}"
NODE=wagma-node1
MARK=.wagma-slurm   # marks DIR as ours, so down.sh removes only what up.sh made

die() { echo "cluster/slurm/up.sh: error: $*" >&2; exit 1; }
cannot() { echo "cluster/slurm/up.sh: cannot run here: $*" >&2; exit 3; }
log() { echo "cluster/slurm/up.sh: $*"; }

[ "$(id -u)" = 0 ] || cannot "must run as root (it installs slurm-wlm/munge and slurmd starts jobs as their users); run it with sudo"
case "$CPUS" in ''|*[!0-9]*) die "WAGMA_SLURM_CPUS must be a positive integer, got '$CPUS'";; esac
[ "$CPUS" -ge 1 ] || die "WAGMA_SLURM_CPUS must be >= 1, got $CPUS"
# A UNIX socket path (munge's lives in DIR) has 107 bytes at most.
case "$DIR" in /*) ;; *) DIR="$(pwd)/$DIR";; esac
[ "${#DIR}" -le 80 ] || die "DIR '$DIR' is too long for munge's socket path (80 characters at most); pass a shorter DIR"

# ------------------------------------------------------------------------------------ packages
PMI2_PLUGIN=mpi_pmi2.so
have_slurm() {
    local cmd
    for cmd in munged munge slurmctld slurmd sinfo srun sbatch scontrol scancel squeue; do
        command -v "$cmd" >/dev/null 2>&1 || return 1
    done
    # srun --mpi=pmi2 needs Slurm's PMI-2 plugin (package slurm-wlm-basic-plugins).
    find /usr/lib -path "*slurm*/$PMI2_PLUGIN" -print -quit 2>/dev/null | grep -q .
}

install_slurm() {
    command -v apt-get >/dev/null 2>&1 || cannot "slurm-wlm/munge are missing and there is no apt-get to install them (install Debian's slurm-wlm and munge by hand)"
    log "installing slurm-wlm and munge with apt-get"
    # No service may start from the packages' install scripts: we start our own daemons, with our
    # own config. policy-rc.d is Debian's switch for that; put one only when there is none.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
    fi
    local out rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show slurm-wlm >/dev/null 2>&1; then
        out="$(apt-get update 2>&1)" || rc=$?
        [ "$rc" = 0 ] || { [ "$own_policy" = 0 ] || rm -f "$policy"; cannot "apt-get update failed ($(echo "$out" | grep -E '^(E|W):' | head -1)); is the package mirror reachable?"; }
    fi
    out="$(apt-get install -y -q --no-install-recommends slurm-wlm munge 2>&1)" || rc=$?
    if [ "$rc" != 0 ] && echo "$out" | grep -q -E 'Unable to locate|404|Failed to fetch'; then
        rc=0; out="$(apt-get update 2>&1 && apt-get install -y -q --no-install-recommends slurm-wlm munge 2>&1)" || rc=$?
    fi
    [ "$own_policy" = 0 ] || rm -f "$policy"
    [ "$rc" = 0 ] || cannot "apt-get install slurm-wlm munge failed: $(echo "$out" | grep -E '^E:' | head -1)"
    have_slurm || die "slurm-wlm/munge installed but a command or the PMI-2 plugin is still missing"
}

have_slurm || install_slurm

# ------------------------------------------------------------------------------- already up?
alive() {  # alive NAME: the daemon whose PID file DIR/run/NAME.pid names is running
    local pid
    pid="$(cat "$DIR/run/$1.pid" 2>/dev/null)" || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}
node_state() { SLURM_CONF="$DIR/etc/slurm.conf" sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }

if [ -f "$DIR/$MARK" ]; then
    if alive munged && alive slurmctld && alive slurmd; then
        case "$(node_state)" in
            idle*|alloc*|mix*|comp*) log "already up in $DIR"; echo "export SLURM_CONF=$DIR/etc/slurm.conf"; exit 0;;
        esac
    fi
    log "a cluster in $DIR is half up: stopping what is left of it first"
    "$HERE/down.sh" "$DIR"
elif [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
    die "$DIR exists and was not made by up.sh; pass another DIR or remove it"
fi

# ------------------------------------------------------------------------------- the folder
mkdir -p "$DIR"
touch "$DIR/$MARK"
mkdir -p "$DIR"/{etc,munge,spool/ctld,spool/d,log,run}
# Only root reads the key; everyone may pass through to munge's socket.
chmod 711 "$DIR" "$DIR/munge"

free_port() {  # a TCP port nobody listens on now
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
if [ -n "${WAGMA_SLURM_PORT:-}" ]; then
    CTLD_PORT="$WAGMA_SLURM_PORT"; SLURMD_PORT=$((WAGMA_SLURM_PORT + 1))
else
    CTLD_PORT="$(free_port)"; SLURMD_PORT="$(free_port)"
    [ "$CTLD_PORT" != "$SLURMD_PORT" ] || SLURMD_PORT="$(free_port)"
fi
HOST="$(hostname -s)"
MEM_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
# 1000 ids per second of the clock, wrapping after about 17 hours (MaxJobId is 67043328).
FIRST_JOB_ID=$(( ($(date +%s) % 60000) * 1000 + 1 ))

sed -e "s|@DIR@|$DIR|g" -e "s|@HOST@|$HOST|g" -e "s|@NODE@|$NODE|g" -e "s|@CPUS@|$CPUS|g" \
    -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@FIRST_JOB_ID@|$FIRST_JOB_ID|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    "$HERE/slurm.conf.in" > "$DIR/etc/slurm.conf"
export SLURM_CONF="$DIR/etc/slurm.conf"
printf 'export SLURM_CONF=%s\n' "$SLURM_CONF" > "$DIR/env.sh"

fail() {  # fail WHAT LOG: one line naming the log to read, then stop what was started
    local why="$1" logf="$2"
    "$HERE/down.sh" --keep "$DIR" >/dev/null 2>&1 || true
    die "$why (last log line: $(tail -n 1 "$logf" 2>/dev/null || echo none); full log: $logf)"
}

# ------------------------------------------------------------------------------- munge
head -c 1024 /dev/urandom > "$DIR/munge/munge.key"
chmod 400 "$DIR/munge/munge.key"
# --force: munged insists that everyone can reach its socket through every parent folder, which a
# private temporary folder (pytest's is 0700) does not allow; only root uses this cluster.
munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
       --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
       --seed-file="$DIR/munge/munged.seed" >>"$DIR/log/munged.log" 2>&1 \
    || fail "munged did not start" "$DIR/log/munged.log"
munge -n -S "$DIR/munge/munge.socket" | unmunge -S "$DIR/munge/munge.socket" >/dev/null 2>&1 \
    || fail "munged is not answering on $DIR/munge/munge.socket" "$DIR/log/munged.log"

# ------------------------------------------------------------------------------- slurm
slurmctld -f "$SLURM_CONF" >>"$DIR/log/slurmctld.log" 2>&1 \
    || fail "slurmctld did not start" "$DIR/log/slurmctld.log"
slurmd -f "$SLURM_CONF" -N "$NODE" >>"$DIR/log/slurmd.log" 2>&1 \
    || fail "slurmd did not start" "$DIR/log/slurmd.log"

for i in $(seq 1 60); do
    case "$(node_state)" in
        idle) log "up: node $NODE with $CPUS CPUs, slurmctld port $CTLD_PORT, state in $DIR"
              echo "export SLURM_CONF=$SLURM_CONF"; exit 0;;
    esac
    if [ "$i" -gt 10 ]; then  # the daemons write their PID files a moment after they fork
        alive slurmctld || fail "slurmctld exited" "$DIR/log/slurmctld.log"
        alive slurmd || fail "slurmd exited" "$DIR/log/slurmd.log"
    fi
    sleep 0.5
done
fail "node $NODE is not idle after 30 s (state '$(node_state)', reason: $(SLURM_CONF="$SLURM_CONF" sinfo -h -R -o %E 2>/dev/null | head -1))" "$DIR/log/slurmd.log"
