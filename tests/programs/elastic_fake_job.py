"""A job that acts out the elastic protocol for the supervisor's tests (tests/test_elastic.py).

    elastic_fake_job.py MODE [RUN_DIR]

At 2 ranks (rank 1 the one lost; at 3 ranks ranks 1 and 2) the modes do this; at 1 rank every mode finishes (after a rejoin
request, it stops for the rejoin instead), unless said otherwise:

    lose         rank 1 hangs, beating (a slow rank); rank 0 records it lost, exits 3
    state_error  rank 0 records a loss whose state could not be saved, exits 3
    die          every rank ends at once with no record (as when Hydra ends a job)
    silent       rank 1 stops itself (SIGSTOP: no heartbeat); rank 0 waits, beating, and records
                 nothing (a survivor stuck in a collective)
    told         as silent, and rank 0 acts on the supervisor's verdict (heartbeat.on_dead): it
                 records the loss with its saved state from the heartbeat thread
    disk_full    rank 1 stops itself; rank 0's loss record meets a full disk, rank 0 exits 3
    late         as lose, and a process of this launch that outlives it writes a loss record
                 during the next launch; at 1 rank the job finishes only after that record
                 appeared (and the supervisor had time to act on it)
    lock         as lose, and a process of this launch holds RUN_DIR's lock for 8 s after it
                 ended; at 1 rank the job takes the lock (RunLock), exits 2 when it is held
    crash        every rank exits 1 in the first launch; at 1 or 2 ranks later: finishes
    env          rank 1's environment worker "fails": it records so and exits 5; rank 0 records
                 it lost, exits 3; later launches finish (at any size)
    (disk_full finishes too after the first launch)
    flap         as lose; at 1 rank it waits 4 s for a rejoin request before it finishes
    in_place     (3 ranks) rank 2 dies; rank 0 records that the job went on in place without it
                 (as an Open MPI job that shrank: named rank 7, by its host and pid), then ranks 0
                 and 1 go on past --dead-after and the grace, and finish
"""
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpi4py import MPI

from wagma_rl import elastic

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
mode = sys.argv[1]
folder = elastic.elastic_dir()
launch = elastic.launch_generation()


def finish():
    """At 1 rank: finish (flap: stop for a rejoin when asked within 4 s, else finish)."""
    end = time.monotonic() + (4 if mode == "flap" else 0)
    while time.monotonic() < end:
        if elastic.rejoin_requested():
            elastic.write_stopped_for_rejoin(frames=1, update=1, checkpoint=None)
            sys.exit(0)
        time.sleep(0.1)
    elastic.write_finished(frames=1, update=1)
    sys.exit(0)


def outliving(code: str) -> None:
    """Start a process of this launch that the supervisor's end of the launch does not reach
    (a rank on a node cut off from the rest); not a rank itself (it does not beat, and must not
    import MPI)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDI_", "MPIR_", "SLURM_"))}
    subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if mode == "in_place":
    import socket

    where = MPI.COMM_WORLD.allgather((socket.gethostname(), os.getpid()))
    time.sleep(1.0)  # (every rank beats first)
    if rank == 2:
        os._exit(9)
    if rank == 0:
        time.sleep(0.5)
        elastic.write_in_place(writer=0, world_size=3,
                               lost=[{"rank": 7, "host": where[2][0], "pid": where[2][1]}])
    time.sleep(5)  # past the supervisor's --dead-after and grace: the launch must go on
    if rank == 0:
        elastic.write_finished(frames=1, update=1)
    os._exit(0)
if mode == "crash":
    if launch == 1:
        os._exit(1)
    size = 1
if mode in ("disk_full", "env", "env_told") and launch > 1:
    size = 1
if mode == "lock" and size == 1:
    from wagma_rl.job.runlock import RunLock, RunLocked

    try:
        RunLock(sys.argv[2]).acquire()
    except RunLocked as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
if mode == "late" and size == 1:
    end = time.monotonic() + 30
    while not elastic.read_losses(folder, launch=launch, stale=(stale := [])) and not stale:
        if time.monotonic() > end:
            sys.exit(5)  # the late record never came: the test fails on the exit status
        time.sleep(0.1)
    time.sleep(3)  # (longer than the supervisor's grace: a stale record it acted on would end us)
if size == 1:
    finish()
if mode == "die":
    os._exit(9)
if rank >= 1 and mode in ("env", "env_told"):
    elastic.write_env_failure(rank=rank, why="env 0 (pid 1, after episode 'e') died during step")
    os._exit(5)
if rank >= 1:
    if mode in ("silent", "told", "disk_full"):
        time.sleep(0.5 + 0.5 * rank)  # beat first (at 3 ranks rank 2 stops 0.5 s after rank 1)
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)  # never answers; the supervisor ends it
    os._exit(0)
if mode in ("told", "env_told"):
    from wagma_rl.elastic import heartbeat

    heartbeat.on_dead(lambda ranks: elastic.write_loss(
        writer=0, world_size=size, lost=[{"rank": r, "host": "h", "pid": 1} for r in ranks],
        checkpoint="ckpt_6.pt", update=6, frames=6, why="no heartbeat"))
if mode in ("silent", "told", "env_told"):
    time.sleep(600)
if mode == "late":
    outliving("import glob, os, time\n"
              f"while not glob.glob({str(folder)!r} + '/beat_{launch + 1}_*'): time.sleep(0.1)\n"
              "from wagma_rl import elastic\n"
              "elastic.write_loss(writer=0, world_size=2, lost=[{'rank': 1}], checkpoint=None, "
              "update=None, frames=None, why='late')\n")
if mode == "lock":
    import fcntl

    lock = Path(sys.argv[2]) / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    # (As RunLock holds it: flock, the holder named in the file.)
    outliving("import fcntl, json, os, socket, time\n"
              f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "os.write(fd, json.dumps({'host': socket.gethostname(), 'pid': os.getpid()}).encode())\n"
              "time.sleep(8)\n")
    while True:  # until it holds the lock (then this launch ends)
        time.sleep(0.1)
        if lock.exists():
            fd = os.open(lock, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                break
            finally:
                os.close(fd)
if mode == "disk_full":
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    elastic._write_json = full
    time.sleep(1.5)
# As a real survivor's timeout does, the record comes after rank 1 has beaten (a loaded machine
# can start its heartbeat late; the supervisor's line tells a beating rank from a silent one).
end = time.monotonic() + 30
while not list(folder.glob(f"beat_{launch}_rank1*")) and time.monotonic() < end:
    time.sleep(0.05)
peer = {"rank": 1, "host": "h", "pid": 1}
error = "cannot write 'ckpt': No space left on device" if mode == "state_error" else None
elastic.write_loss(writer=0, world_size=size, lost=[peer], checkpoint=None, update=None,
                   frames=None, why="rank 1 did not answer within 5 s (timeout)", state_error=error)
os._exit(3)
