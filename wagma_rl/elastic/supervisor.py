"""The supervisor: run a job, relaunch it on the slots that are left when ranks are lost, and on
every slot again when the lost hosts answer.

It is not a daemon on the nodes and not a transport: it runs where ``mpiexec`` (or the batch
script's ``srun``) would run, starts the job through the same launcher, and reads the records the
job's ranks write (:mod:`wagma_rl.elastic`). A launch's ranks are placed in slot order (host by
host), so the supervisor knows which host each rank was on. Every launch has a generation (1, 2,
...) that the job's records carry; a record of an earlier launch is ignored, with a line.

While a launch runs, it watches the ranks' heartbeats (:mod:`wagma_rl.elastic.heartbeat`):

* a rank that beat and then went silent for ``dead_after`` seconds is dead (its process stopped or
  gone, or its node gone), said as such; when the survivors do not record the loss within
  ``grace`` seconds the supervisor ends the launch itself and goes on without that rank from the
  newest checkpoint, instead of waiting out ``averaging.timeout`` (which stays the limit for a rank
  that is slow but beating: the survivors record it, and the line says it was alive);
* the watchdog: a launch whose ranks all went silent for ``watchdog`` seconds without a record
  (e.g. the survivors could not write one on a full disk, and a stopped rank keeps the launcher
  waiting) is ended and handled as a launch that ended without a record.

Decisions, in order, when a launch ends:

* the job spent its frame budget (``finished.json``): done, exit 0;
* a user's stop signal reached the supervisor: passed on to the job, no relaunch;
* it stopped because the supervisor asked (lost hosts answer again, ``stopped.json``): relaunch on
  every slot;
* a survivor wrote a loss record (acted on as soon as no other record could go on instead, else
  after ``grace``), or the heartbeats named dead ranks: take the lost ranks' slots
  out (quarantine) and relaunch on the rest, which resume from the state the survivors saved (the
  RL trainer) or from the job's newest checkpoint (when they could not save it, when the heartbeats
  decided, and for any other job of the project's exit policy, ``wagma_rl.job.exits.run_main``);
* a relaunched rank 0 could not take the run folder's lock (``lock_busy.json``: a rank of the earlier
  launch still holds it, or the shared file system keeps a dead client's lock until its lease
  expires): wait until the lock is free, at most ``lock_wait`` seconds, and relaunch;
* a crash (exit 1: a CUDA error, a dead simulator worker): relaunch on the same slots from the
  newest checkpoint, at most ``max_crashes`` times within ``relaunch_window`` seconds;
* a configuration error, non-finite values, an interrupt (exit 2, 4, 130) or a clean stop (0):
  stop with the job's exit status and one line saying why, where every rank that beat ended by
  itself (its last beat says so; else the status is the launcher's, e.g. PRRTE's 0 after it
  ended a job that lost a node, and the launch counts as lost, below);
* anything else (the launcher ended every rank, e.g. Hydra when a node's proxy dies; the
  watchdog): probe every host through the launcher, take out those that do not answer, relaunch on
  the rest from the job's newest checkpoint.

Under Open MPI's ``mpirun`` with ``--with-ft ulfm`` the job survives a lost rank in place
(docs/mpi.md): it shrinks and writes an *in-place record* (:func:`wagma_rl.elastic.write_in_place`)
instead of a loss record; the supervisor takes those ranks' slots out and stops expecting their
heartbeats, and the launch goes on. What ULFM cannot survive still ends the launch and is handled as
above: a whole node (PRRTE ends the job when one of its daemons is lost), a stopped rank (its
heartbeat stops; the survivors save and record at the supervisor's verdict, as on MPICH).

A lost host is tried again (a probe through the launcher, one per host) after its quarantine:
``rejoin_after`` seconds, doubled each time the host is lost again (exponential backoff); a host
lost ``max_flaps`` times is excluded for good. When hosts answer, the job is asked to stop at its
next synchronised update (:func:`wagma_rl.elastic.request_rejoin`) and is relaunched on every slot
they give back. Relaunches for losses and crashes are counted over the last ``relaunch_window``
seconds (a rolling budget, ``max_relaunches``); rejoins and lock waits are not counted.
"""
from __future__ import annotations

import dataclasses
import fcntl
import inspect
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from . import (ELASTIC_DIR_ENV, HYDRA_NOTIFIES_ENV, LAUNCH_ENV, clear, env_failures, finished,
               lock_busy, read_in_place, read_losses, request_rejoin, stopped_for_rejoin,
               write_launch_note)
from .heartbeat import BEAT_ENV, Liveness, write_dead

__all__ = ["Launcher", "Supervisor", "SupervisorError", "SupervisorSetupError", "parse_hosts", "records_settled",
           "slurm_slots"]

TIMEOUT_EXIT = 3  # wagma_rl.job.exits.EXIT_CODES["timeout"]: ranks were lost
CONFIG_EXIT = 2  # wagma_rl.job.exits.EXIT_CODES["config"]: the supervisor's own setup is wrong
CRASH_EXIT = 1  # wagma_rl.job.exits.EXIT_CODES["crash"]: relaunched, a bounded number of times
#: Exit statuses after which a relaunch could only repeat the failure (wagma_rl.job.exits.EXIT_CODES).
STOP_CODES = {0: "stopped by a signal", 2: "a configuration error", 4: "non-finite values",
              130: "interrupted"}


class SupervisorError(RuntimeError):
    """The job cannot go on; the message is the one line the user sees."""


class SupervisorSetupError(SupervisorError):
    """The supervisor's own command line or environment is wrong (exit 2, as a config error):
    nothing was launched, no rank was lost."""


def parse_hosts(text: str, ppn: int) -> dict[str, int]:
    """``"n0,n1"`` or ``"n0:2,n1:3"`` into slots per host (``ppn`` where a host gives no count)."""
    slots: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        host, _, count = item.partition(":")
        if count and not count.isdigit() or (count and int(count) < 1):
            raise SupervisorSetupError(f"--hosts: '{item}' is not HOST or HOST:COUNT with COUNT >= 1")
        slots[host] = slots.get(host, 0) + (int(count) if count else ppn)
    if not slots:
        raise SupervisorSetupError("--hosts names no host; give e.g. --hosts node1,node2 --ppn 8")
    return slots


def slurm_slots(environ=os.environ) -> dict[str, int]:
    """The allocation's slots per node, from SLURM's variables (inside ``sbatch``/``salloc``)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise SupervisorSetupError("--slurm: not inside a SLURM allocation (no SLURM_JOB_NODELIST); "
                              "run it from an sbatch script or salloc")
    proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SupervisorError(f"scontrol show hostnames {nodelist}: {proc.stderr.strip()}")
    hosts = proc.stdout.split()
    counts = _expand_counts(environ.get("SLURM_TASKS_PER_NODE", ""))
    if len(counts) != len(hosts):
        ntasks = int(environ.get("SLURM_NTASKS", len(hosts)))
        counts = [ntasks // len(hosts) + (i < ntasks % len(hosts)) for i in range(len(hosts))]
    return dict(zip(hosts, counts))


def _expand_counts(text: str) -> list[int]:
    """SLURM's ``2(x3),1`` into ``[2, 2, 2, 1]``."""
    out: list[int] = []
    for item in filter(None, text.split(",")):
        count, _, rep = item.partition("(x")
        out += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
    return out


@dataclasses.dataclass
class Launcher:
    """How the job's ranks are started: Hydra's ``mpiexec`` (with whatever arguments reach the
    hosts, e.g. ``-launcher ssh``), Open MPI's ``mpirun`` (PRRTE; with ``--with-ft ulfm`` the
    survivors of a lost rank go on in place and only a lost node needs a relaunch), or ``srun``
    inside an allocation."""

    prefix: list[str]
    kind: str = "mpiexec"  # or "openmpi", "srun"
    #: inside a SLURM allocation, hosts are probed with ``srun --overlap`` whatever starts the
    #: job (a second mpirun there would ask SLURM for a step the job's holds)
    probe_with_srun: bool = False

    @classmethod
    def detect(cls, prefix: list[str]) -> "Launcher":
        """The launcher ``prefix`` starts, told by its ``--version`` line: Open MPI's ``mpirun``
        or ``prterun`` says "Open MPI" or "PRRTE"; anything else is taken for Hydra's
        ``mpiexec`` (MPICH, Intel MPI, MVAPICH), as before."""
        try:
            out = subprocess.run([prefix[0], "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return cls(prefix)  # (a launcher that cannot start is said at the first launch)
        return cls(prefix, kind="openmpi" if ("Open MPI" in out or "PRRTE" in out) else "mpiexec")

    def command(self, slots: dict[str, int], argv: Sequence[str], hostfile: Path) -> list[str]:
        hosts = [h for h, n in slots.items() if n > 0]
        total = sum(slots.values())
        if self.kind == "srun":
            # One line per rank, in rank order: srun places exactly that (--distribution=arbitrary).
            hostfile.write_text("".join(f"{h}\n" * n for h, n in slots.items() if n > 0))
            # (SLURM_HOSTFILE names it; the supervisor sets it for the launch.)
            # --no-kill: a node that fails does not end the step, so the survivors save and
            # record before the supervisor ends what is left.
            return [*self.prefix, "--kill-on-bad-exit=0", "--no-kill", f"--nodes={len(hosts)}",
                    f"--ntasks={total}", "--distribution=arbitrary", *argv]
        listed = ",".join(f"{h}:{n}" for h, n in slots.items() if n > 0)
        if self.kind == "openmpi":
            # PRRTE hands the ranks on other nodes only the variables named with -x; --map-by
            # slot fills each host's slots in turn.
            forward = [arg for name in (ELASTIC_DIR_ENV, LAUNCH_ENV, BEAT_ENV) for arg in ("-x", name)]
            return [*self.prefix, "--host", listed, "--map-by", "slot", *forward, "-n", str(total),
                    *argv]
        # -disable-auto-cleanup: Hydra lets the survivors of a lost rank run on, so that they
        # save their state and record the loss instead of being killed.
        return [*self.prefix, "-disable-auto-cleanup", "-hosts", listed, "-n", str(total), *argv]

    def probe(self, host: str) -> list[str]:
        """A command that succeeds when ``host`` can run a rank again."""
        if self.kind == "srun" or self.probe_with_srun:
            # (--overlap: beside the job's own step, on its resources)
            return [*(self.prefix if self.kind == "srun" else ["srun"]), "--overlap",
                    f"--nodelist={host}", "--nodes=1", "--ntasks=1", "true"]
        if self.kind == "openmpi":
            return [*self.prefix, "--host", f"{host}:1", "-n", "1", "true"]
        return [*self.prefix, "-hosts", host, "-n", "1", "true"]

    def stop(self, proc: subprocess.Popen) -> None:
        """End a launch whose survivors have saved their state (a rank that never exits, e.g. a
        stopped one, would keep it waiting)."""
        # srun ends the job step at two SIGINTs within a second; mpirun ends its ranks and the
        # daemons on the other nodes at SIGTERM (a SIGKILL would leave those to notice the lost
        # connection). Hydra's mpiexec, or a launcher that did not end in time: SIGKILL.
        sig, times, wait_s = _GENTLE_STOP.get(self.kind, (None, 0, 0))
        for _ in range(times):
            _signal(proc, sig)
            time.sleep(0.2)
        if times:
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                pass
        _signal(proc, signal.SIGKILL, group=True)


#: launcher kind -> (signal, how many times 0.2 s apart, seconds to wait) that ends it gently
_GENTLE_STOP = {"srun": (signal.SIGINT, 2, 30), "openmpi": (signal.SIGTERM, 1, 10)}


def _signal(proc: subprocess.Popen, sig: int, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def records_settled(record: dict, dead: Sequence[int]) -> bool:
    """Whether the loss record ``record`` (the first of :func:`wagma_rl.elastic.read_losses`)
    decides: no other record could go on instead. Only the ranks it names lost could write one
    (for their own side, on a split network), and not those dead by their heartbeats (``dead``);
    their side goes on instead when it holds more ranks, or as many with a lower one."""
    side = record.get("survivors") or []
    could = {int(p["rank"]) for p in record.get("lost", [])} - set(dead)
    if not side:
        return False
    return not could or len(could) < len(side) or \
        (len(could) == len(side) and min(could) > min(side))


class Supervisor:
    """Run ``argv`` on ``slots`` (host -> ranks) through ``launcher`` until it finishes.

    Seconds: ``rejoin_after`` (a lost host's first quarantine, doubled at each further loss),
    ``probe_timeout`` (a host's time to start a process when tried), ``grace`` (after a dead
    verdict, or a loss record that another side's record could still overrule, before the launch
    is ended), ``dead_after`` (a rank silent this long is
    dead), ``watchdog`` (every rank silent this long, no record: the launch is ended),
    ``lock_wait`` (the longest wait for the run folder's lock of an earlier launch),
    ``relaunch_window`` (the span of the rolling budget). Counts: ``max_relaunches`` (relaunches
    for losses and crashes within the window), ``max_crashes`` (of those, for exit 1),
    ``max_flaps`` (a host lost this many times is excluded for good)."""

    def __init__(self, launcher: Launcher, slots: dict[str, int], argv: Sequence[str], *,
                 state_dir: Path | None = None, rejoin_after: float = 60.0,
                 probe_timeout: float = 30.0, max_relaunches: int = 10,
                 relaunch_window: float = 3600.0, max_crashes: int = 2, max_flaps: int = 3,
                 grace: float = 3.0, dead_after: float = 10.0, watchdog: float = 120.0,
                 lock_wait: float = 300.0, say=None):
        self.launcher = launcher
        self.full = dict(slots)
        self.slots = dict(slots)
        self.argv = list(argv)
        self.dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="wagma-elastic-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rejoin_after = rejoin_after
        self.probe_timeout = probe_timeout
        self.max_relaunches = max_relaunches
        self.relaunch_window = relaunch_window
        self.max_crashes = max_crashes
        self.max_flaps = max_flaps
        self.grace = grace
        self.dead_after = dead_after
        self.watchdog = watchdog
        self.lock_wait = lock_wait
        self.say = say or (lambda line: print(f"elastic [{time.strftime('%H:%M:%S')}]: {line}",
                                              file=sys.stderr, flush=True))
        self.launch = 0  # the generation of the current (or last) launch
        self.out_since: dict[str, float] = {}  # host -> when its slots were taken out
        self.quarantine: dict[str, float] = {}  # host -> seconds it stays out this time
        self.losses: dict[str, int] = {}  # host -> times it was lost
        self.excluded: set[str] = set()  # hosts lost max_flaps times: never tried again
        self.charged: list[tuple[float, str]] = []  # (when, why) of each counted relaunch
        self.events: list[dict] = []  # what happened, for the caller and the tests
        self._stale_seen: set[tuple[str, object]] = set()
        self._lock_waited = 0.0
        self._user_signal: int | None = None
        self._proc: subprocess.Popen | None = None
        self._placement: list[str] = []  # the current launch's host of each rank, in slot order
        self._live: Liveness | None = None  # the current launch's heartbeats

    # ------------------------------------------------------------------------------- the loop
    def run(self) -> int:
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, self._forward)
                   for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
        try:
            while True:
                rc, rejoining, ended = self._launch_once()
                why = self._decide(rc, rejoining, ended)
                if isinstance(why, int):
                    return why
                if why:
                    self._charge(why)
        except _GiveUp:
            return TIMEOUT_EXIT
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            clear(self.dir)
            for name in ("launch.json", "hostfile"):
                (self.dir / name).unlink(missing_ok=True)
            try:
                self.dir.rmdir()  # (left where it holds files of someone else's)
            except OSError:
                pass

    def _decide(self, rc: int, rejoining: list[str], ended: dict) -> int | str | None:
        """What to do after a launch: an exit status (stop), or relaunch (a reason to count in the
        rolling budget, or None for one that is not counted)."""
        losses = read_losses(self.dir, launch=self.launch)
        if finished(self.dir, launch=self.launch):
            return 0
        if self._user_signal is not None:
            self.say(f"stopped by signal {signal.Signals(self._user_signal).name} (exit status {rc})")
            return rc
        if rejoining and stopped_for_rejoin(self.dir, launch=self.launch):
            for host in rejoining:
                self.slots[host] = self.full[host]
                self.out_since.pop(host, None)
            self.events.append({"event": "rejoin", "hosts": rejoining, "at": time.time()})
            self._note(f"{', '.join(rejoining)} rejoined", self._ended_at,
                       since="the job stopped for them")
            return None
        software = env_failures(self.dir, launch=self.launch)
        if software and (not losses or {p["rank"] for p in losses[0]["lost"]} <= software):
            # The ranks ended because their simulator failed (exit 5), not their hosts: relaunch
            # on the same slots, counted as a crash.
            return self._crashed(rc, f"the environment worker of rank(s) "
                                     f"{', '.join(map(str, sorted(software)))} failed")
        if losses:
            self._take_out(losses[0], ended)
            return "a loss"
        if ended["why"] == "dead":
            self._take_out_dead(ended)
            return "a loss"
        busy = lock_busy(self.dir, launch=self.launch)
        if rc == CONFIG_EXIT and busy and self.launch > 1:  # (at the first: another run's folder)
            self._wait_for_lock(busy)
            return None
        self._lock_waited = 0.0
        if rc == CRASH_EXIT:
            return self._crashed(rc, "the job crashed (exit status 1)")
        # A stop status is the job's word only where every rank that beat ended by itself: PRRTE
        # exits 0 when it ends a job whose node's daemon was lost, its ranks there killed.
        unended = [r for r, silent in ended["silent"].items() if silent is not None]
        if rc in STOP_CODES and ended["why"] is None and not unended:
            if rc != 0:  # (a refused start writes no log.txt: its one line is in the output)
                where = "its error line above" if rc == CONFIG_EXIT else "its output and log.txt"
                self.say(f"the job stopped with exit status {rc} ({STOP_CODES[rc]}): not "
                         f"relaunched; see {where}")
            return rc
        self._launch_lost(rc, ended)
        return "a lost launch"

    def _crashed(self, rc: int, what: str) -> int | str:
        """A fault of the software, not of a host (exit 1, a failed environment worker): relaunch
        on the same slots from the newest checkpoint, at most ``max_crashes`` times within the
        window; returns the exit status to stop with, or the reason to count."""
        now = time.time()
        crashes = sum(1 for t, why in self.charged
                      if why == "a crash" and now - t < self.relaunch_window)
        if crashes >= self.max_crashes:
            self.say(f"{what}, {crashes + 1} crashes within {self.relaunch_window:g} s "
                     f"(--max-crashes {self.max_crashes}): not relaunched; see its output and "
                     "log.txt")
            return rc
        self.events.append({"event": "crash", "rc": rc, "at": now})
        self._note(f"{what} ({crashes + 1} of --max-crashes {self.max_crashes}): going on from "
                   "the newest checkpoint on the same hosts", self._ended_at, since="the job ended")
        return "a crash"

    def _charge(self, why: str) -> None:
        """Count a relaunch in the rolling budget; give up when the window holds too many."""
        now = time.time()
        self.charged = [(t, w) for t, w in self.charged if now - t < self.relaunch_window]
        self.charged.append((now, why))
        if len(self.charged) > self.max_relaunches:
            self.say(f"gave up: {len(self.charged)} relaunches within {self.relaunch_window:g} s "
                     f"(--max-relaunches {self.max_relaunches} per --relaunch-window)")
            raise _GiveUp()

    # ------------------------------------------------------------------------ taking hosts out
    def _lose(self, host: str, now: float) -> None:
        """``host`` lost a rank (or all): quarantine it, for longer at every loss (exponential
        backoff), or for good after ``max_flaps`` losses."""
        self.losses[host] = self.losses.get(host, 0) + 1
        if self.losses[host] >= self.max_flaps:
            if host not in self.excluded:
                self.excluded.add(host)
                self.out_since.pop(host, None)
                self.events.append({"event": "excluded", "host": host, "at": now})
                self.say(f"{host} was lost {self.losses[host]} times (--max-flaps "
                         f"{self.max_flaps}): excluded for the rest of the run")
            return
        self.out_since[host] = now
        self.quarantine[host] = self.rejoin_after * 2 ** (self.losses[host] - 1)

    def _out(self, ranks: Sequence[int], now: float) -> dict[int, str]:
        """Take the slots of the lost ``ranks`` (the launch's) out, each a loss of its host: the
        host its heartbeat named, else the one its place in slot order gives; returns rank ->
        host (ranks of the launch only)."""
        hosts = {r: self._host_of(r) for r in sorted(set(ranks))}
        hosts = {r: h for r, h in hosts.items() if h is not None}
        for host in hosts.values():
            self.slots[host] -= 1
        if sum(self.slots.values()) == 0:
            raise SupervisorError("every rank was lost; resume the job from its newest "
                                  "checkpoint when the hosts are back")
        for host in dict.fromkeys(hosts.values()):
            self._lose(host, now)
        return hosts

    def _host_of(self, rank: int) -> str | None:
        info = self._live.seen.get(rank) if self._live is not None else None
        if info is not None and info["host"] in self.slots:
            return info["host"]
        return self._placement[rank] if 0 <= rank < len(self._placement) else None

    def _launch_ranks(self, lost: Sequence[dict]) -> list[int]:
        """The launch's ranks of a record's ``lost`` entries: found by host and pid in the
        heartbeats (after a shrink the job's ranks are no longer the launch's), else as named."""
        ranks = []
        for p in lost:
            found = self._live.rank_of(p.get("host", "?"), int(p.get("pid", 0))) \
                if self._live is not None else None
            ranks.append(int(p["rank"]) if found is None else found)
        return ranks

    def _went_on_in_place(self, record: dict, live: Liveness) -> None:
        """The job shrank and went on without ranks in the same processes (Open MPI with ULFM,
        docs/mpi.md): their slots are taken out and their hosts tried again after the
        quarantine, as for a relaunch, but the launch goes on."""
        now = time.time()
        ranks = self._launch_ranks(record["lost"])
        live.gone.update(ranks)
        hosts = self._out(ranks, now)
        self.events.append({"event": "in_place", "ranks": sorted(hosts), "at": now,
                            "detected_at": record.get("at")})
        names = ", ".join(f"rank {r} ({h})" for r, h in hosts.items()) or "ranks"
        self.say(f"the job went on in place without {names} (its record, by its new rank 0 of "
                 f"{sum(self.slots.values())}): no relaunch; the hosts are tried again after "
                 "their quarantine")

    def _take_out(self, record: dict, ended: dict) -> None:
        now = time.time()
        ranks = self._launch_ranks(record["lost"])
        self.events.append({"event": "loss", "ranks": ranks,
                            "detected_at": record["detected_at"], "at": now,
                            "checkpoint": record["checkpoint"], "acted": ended.get("acted")})
        hosts = self._out(ranks, now)
        lost = [f"rank {r} ({h}{self._verdict(r, ended, record.get('why') or '')})"
                for r, h in hosts.items()]
        if record.get("state_error"):
            saved = (f"the survivors could not save their state ({record['state_error']}): going "
                     "on from the newest checkpoint")
        elif record.get("checkpoint"):
            saved = ("the survivors saved "
                     + (record.get("saved") or f"update {record['update']} ({record['frames']} frames)"))
        else:
            saved = "going on from the newest checkpoint"
        self._note(f"lost {', '.join(lost) or 'ranks'} (found by rank {record['writer']}); {saved}",
                   record["detected_at"])

    @staticmethod
    def _verdict(rank: int, ended: dict, why: str) -> str:
        """What the heartbeats said of a rank the survivors reported lost (``why``: their line)."""
        silent = ended["silent"].get(rank)
        if silent is None:
            return ""
        if silent >= 2 * ended["beat"] + 1:
            return f"; dead: no heartbeat for {silent:.0f} s"
        if "(timeout" in why:  # (the line of a missed deadline, not of an MPI error)
            return "; alive but slow: its heartbeat went on, averaging.timeout decided"
        return ""

    def _take_out_dead(self, ended: dict) -> None:
        """The heartbeats named dead ranks and the survivors recorded nothing in time."""
        now = time.time()
        self.events.append({"event": "dead", "ranks": ended["dead"], "detected_at": ended["at"],
                            "at": now})
        self._out(ended["dead"], now)
        self._note(f"{ended['line']}; going on from the newest checkpoint", ended["at"])

    def _wait_for_lock(self, busy: dict) -> None:
        """The new rank 0 met the run lock still held (by a rank of an earlier launch, or a dead
        client's lock the file system keeps until its lease expires): wait until it is free
        (where this host sees the file), at most ``lock_wait`` seconds over consecutive tries."""
        holder = busy.get("holder") or {}
        left = self.lock_wait - self._lock_waited
        if left <= 0:
            raise SupervisorError(
                f"the run folder's lock {busy['lock']} is still held (host {holder.get('host', '?')}, "
                f"pid {holder.get('pid', '?')}) after {self.lock_wait:g} s (--lock-wait): end that "
                "process, then resume the job")
        self.say(f"the run lock {busy['lock']} is still held (host {holder.get('host', '?')}, pid "
                 f"{holder.get('pid', '?')}: a rank of an earlier launch that has not ended, or a "
                 f"dead client's lock the file system keeps): waiting for it, at most {left:.0f} s")
        t0 = time.monotonic()
        pause = 0.5
        while time.monotonic() - t0 < left and not _lock_is_free(busy["lock"]):
            if self._user_signal is not None:
                return
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
        waited = time.monotonic() - t0
        self._lock_waited += waited
        self.events.append({"event": "lock_wait", "waited": waited, "at": time.time()})
        self._note(f"waited {waited:.1f} s for the run lock", self._ended_at,
                   since="the job ended")

    def _launch_lost(self, rc: int, ended: dict) -> None:
        """The launch ended without the survivors' record: the launcher ended every rank (Hydra
        does when a node's proxy dies; MPICH's shared-memory transport ends a node's ranks when
        one of them is killed), or the watchdog ended it. Hosts that do not answer a probe are
        taken out; the job goes on from its newest checkpoint on the rest."""
        hosts = [h for h, n in self.slots.items() if n > 0]
        answer = self._probe(hosts)
        gone = [h for h in hosts if not answer[h]]
        now = time.time()
        if len(gone) == len(hosts):
            raise SupervisorError(f"the job ended (exit status {rc}) and none of its hosts "
                                  f"({', '.join(hosts)}) answers; resume it from its newest "
                                  "checkpoint when they are back")
        self.events.append({"event": "restart", "hosts_out": gone, "rc": rc, "at": now})
        for host in gone:
            self.slots[host] = 0
            self._lose(host, now)
        why = (f"{', '.join(gone)} did not answer" if gone else
               "every host answers (a rank was lost on one of them)")
        what = ended["line"] if ended["why"] == "watchdog" else \
            f"the job ended (exit status {rc}) without a record from survivors"
        self._note(f"{what}: {why}; going on from the newest checkpoint", self._ended_at,
                   since="the job ended")

    def _probe(self, hosts: Sequence[str]) -> dict[str, bool]:
        """Try every host at once (a one-process launch of ``true`` each); which answered within
        ``probe_timeout``."""
        probes = {h: self._start_probe(h) for h in hosts}
        end = time.monotonic() + self.probe_timeout
        while time.monotonic() < end and any(p.poll() is None for p in probes.values()):
            time.sleep(0.1)
        return {h: self._end_probe(p) for h, p in probes.items()}

    def _start_probe(self, host: str) -> subprocess.Popen:
        return subprocess.Popen(self.launcher.probe(host), env=dict(os.environ),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    @staticmethod
    def _end_probe(p: subprocess.Popen) -> bool:
        if p.poll() == 0:
            return True
        _signal(p, signal.SIGKILL, group=True)
        p.wait()
        return False

    def _note(self, why: str, detected_at: float, since: str = "the loss was detected") -> None:
        """Say why the job is relaunched, here and (through the launch note) in its log."""
        line = f"{why}; relaunching on {self._describe()}"
        self.say(line)
        write_launch_note(self.dir, reason=line, detected_at=detected_at, since=since,
                          world_size=sum(self.slots.values()))

    def _describe(self) -> str:
        hosts = ",".join(f"{h}:{n}" for h, n in self.slots.items() if n > 0)
        n = sum(self.slots.values())
        return f"{n} rank{'s' if n != 1 else ''} ({hosts})"

    # --------------------------------------------------------------------------- one launch
    def _launch_once(self) -> tuple[int, list[str], dict]:
        """One launch to its end; returns (exit status, hosts asked to rejoin, how it ended:
        {"why": None (by itself), "loss", "dead" or "watchdog", "silent": seconds each rank had
        been silent, "beat", "dead"; "line" and "at" for the supervisor's own verdicts})."""
        clear(self.dir)
        self.launch += 1
        beat = self._beat
        env = dict(os.environ, **{ELASTIC_DIR_ENV: str(self.dir), LAUNCH_ENV: str(self.launch),
                                  BEAT_ENV: f"{beat:g}"})
        hostfile = self.dir / "hostfile"
        if self.launcher.kind == "srun":
            env["SLURM_HOSTFILE"] = str(hostfile)
        elif self.launcher.kind == "mpiexec":
            env[HYDRA_NOTIFIES_ENV] = "1"
        self._placement = [h for h, n in self.slots.items() for _ in range(n)]
        cmd = self.launcher.command(self.slots, self.argv, hostfile)
        self.events.append({"event": "launch", "ranks": sum(self.slots.values()), "at": time.time(),
                            "launch": self.launch})
        try:
            proc = self._proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        except OSError as exc:
            raise SupervisorSetupError(f"cannot start the launcher '{cmd[0]}': {exc.strerror}; give its "
                                  "path with --launcher (or activate the environment that has it)")
        live = self._live = Liveness(self.dir, self.launch)
        in_place: list[dict] = []  # the job's records of shrinks it went on from (Open MPI)
        probes: dict[str, subprocess.Popen] = {}
        probes_since = 0.0
        rejoining: list[str] = []
        lost_seen: float | None = None
        settled = False  # the loss record that decides is in: no other could go on instead
        ended: dict | None = None
        verdict: dict | None = None
        last_read = 0.0
        while proc.poll() is None:
            time.sleep(0.2)
            now, mono = time.time(), time.monotonic()
            if mono - last_read >= min(1.0, beat):
                last_read = mono
                self._say_stale()
                live.poll(mono)
                for record in read_in_place(self.dir, launch=self.launch)[len(in_place):]:
                    in_place.append(record)
                    self._went_on_in_place(record, live)
                    if verdict is not None and set(verdict["dead"]) <= live.gone:
                        verdict = None  # (the job went on without them before the grace ran out)
                # A rank that recorded its environment worker's failure exits (status 5) without
                # a word to its peers: it is as dead as a silent one, at once.
                failed = sorted(env_failures(self.dir, launch=self.launch) - live.gone)
                dead = sorted(set(live.dead(self.dead_after, mono)) | set(failed))
                if not settled:
                    records = read_losses(self.dir, launch=self.launch)
                    if records and lost_seen is None:
                        lost_seen = now
                    settled = bool(records) and records_settled(records[0], dead)
                if lost_seen is None and verdict is None and dead:
                    verdict = self._dead_verdict(live, dead, mono, now, failed=failed)
                quiet = live.quiet_for(mono)
                if lost_seen is None and verdict is None and quiet is not None and \
                        quiet >= self.watchdog:
                    line = (f"no progress: no rank of launch {self.launch} has beaten for "
                            f"{quiet:.0f} s and none recorded why (--watchdog {self.watchdog:g})")
                    self.say(f"{line}: ending the launch")
                    ended = dict(self._snapshot(live, mono), why="watchdog", line=line, at=now)
                    self.launcher.stop(proc)
                    break
            if lost_seen is not None and (settled or now - lost_seen > self.grace):
                # (At once when no other record could go on instead; else the grace lets one come.)
                live.poll(mono)
                ended = dict(self._snapshot(live, mono), why="loss",
                             acted="at once" if settled else "after the grace")
                self.launcher.stop(proc)  # the survivors have saved and reported: end the rest
                break
            if verdict is not None and lost_seen is None and now - verdict["at"] > self.grace:
                # The survivors did not record it in time: end the launch, without every rank
                # dead by now (a node's ranks cross --dead-after within a beat of each other).
                live.poll(mono)
                ended = self._dead_verdict(live, sorted(set(verdict["dead"]) |
                                                        set(live.dead(self.dead_after, mono))),
                                           mono, verdict["at"], say=False,
                                           failed=verdict["failed"])
                self.launcher.stop(proc)
                break
            if not probes and not rejoining:
                ready = [h for h, t in self.out_since.items()
                         if now - t >= self.quarantine.get(h, self.rejoin_after)]
                if ready:
                    probes, probes_since = {h: self._start_probe(h) for h in ready}, mono
            elif probes:
                if any(p.poll() is None for p in probes.values()) and \
                        mono - probes_since < self.probe_timeout:
                    continue
                answer = {h: self._end_probe(p) for h, p in probes.items()}
                probes = {}
                back = [h for h, ok in answer.items() if ok]
                for h, ok in answer.items():
                    if not ok:  # try again after another quarantine period
                        self.out_since[h] = now
                if back:
                    rejoining = back
                    request_rejoin(self.dir, back, launch=self.launch)
                    self.say(f"{', '.join(back)} answer again: asking the job to stop at its next "
                             "synchronised update for a relaunch")
        rc = proc.wait()
        self._ended_at = time.time()
        # What the launcher left on this host (e.g. ranks of a launcher that died) must not hold
        # the run folder's lock against the next launch.
        _signal(proc, signal.SIGKILL, group=True)
        for p in probes.values():
            self._end_probe(p)
        self._proc = None
        self._say_stale()
        if ended is None:  # (the ranks' last beats: "ended" where they exited by themselves)
            live.poll(time.monotonic())
        return rc, rejoining, ended or dict(self._snapshot(live, time.monotonic()), why=None)

    def _dead_verdict(self, live: Liveness, dead: list[int], mono: float, now: float, *,
                      say: bool = True, failed: Sequence[int] = ()) -> dict:
        """The verdict on ``dead`` (said, and written for the job, when ``say``): silent by their
        heartbeats, or ``failed``: their environment worker failed, so they exit."""
        parts = []
        silent = [r for r in dead if r not in failed]
        if failed:
            names = ", ".join(live.describe(r) for r in failed)
            parts.append(f"{names}: its environment worker failed (the rank recorded it and exits "
                         f"with status 5): dead")
        if silent:
            names = ", ".join(live.describe(r) for r in silent)
            parts.append(f"{names}: no heartbeat for {self.dead_after:g} s (--dead-after): dead "
                         f"(its process stopped or gone, or its node gone; a slow rank keeps "
                         f"beating and is left to averaging.timeout)")
        line = "; ".join(parts)
        if say:
            self.say(f"{line}; waiting {self.grace:g} s for the survivors' record")
            write_dead(self.dir, self.launch, dead)
        return dict(self._snapshot(live, mono), why="dead", line=line, at=now, dead=dead,
                    failed=list(failed))

    @property
    def _beat(self) -> float:
        """Seconds between a rank's beats: five within ``dead_after``, 0.2 to 1 s."""
        return min(max(self.dead_after / 5, 0.2), 1.0)

    def _snapshot(self, live: Liveness, mono: float) -> dict:
        """The heartbeats' state when a launch ends: seconds each rank has been silent."""
        return {"silent": {r: live.silent(r, mono) for r in live.seen}, "beat": self._beat,
                "dead": live.dead(self.dead_after, mono)}

    def _say_stale(self) -> None:
        """One line for each record of an earlier launch (written late, by a rank of a launch that
        had ended for the supervisor): ignored."""
        stale: list[dict] = []
        read_losses(self.dir, launch=self.launch, stale=stale)
        for record in stale:
            key = (record["file"], record.get("launch"))
            if key not in self._stale_seen:
                self._stale_seen.add(key)
                self.events.append({"event": "stale", "launch": record.get("launch"),
                                    "at": time.time()})
                self.say(f"ignored {record['file']} from launch {record.get('launch')} (this is "
                         f"launch {self.launch}): a late record of an earlier launch")

    def _forward(self, signum, frame) -> None:
        """A stop signal for the supervisor is for the job: pass it on, relaunch no more."""
        self._user_signal = signum
        if self._proc is not None:
            _signal(self._proc, signum)


class _GiveUp(Exception):
    """The rolling relaunch budget is spent (said already)."""


def _lock_is_free(path: str) -> bool:
    """Whether no process holds the run lock ``path`` now (a file this host cannot open counts as
    free: the relaunched job then finds out). Takes and drops the lock at once: only between
    launches."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (drops the lock if it was taken)


#: The supervisor's bounds on the command line: (option, type, metavar, help); the defaults are
#: Supervisor's.
_OPTIONS = (
    ("--rejoin-after", float, "S", "seconds a lost host stays out before it is tried again, "
                                   "doubled at each further loss of that host"),
    ("--max-flaps", int, "N", "a host lost this many times is not tried again"),
    ("--probe-timeout", float, "S", "seconds a host has to start a process before it counts as gone"),
    ("--dead-after", float, "S", "a rank whose heartbeat stopped this long is dead; a slow rank "
                                 "that beats is left to the job's averaging.timeout"),
    ("--watchdog", float, "S", "end a launch whose ranks all stopped beating this long without "
                               "a record"),
    ("--lock-wait", float, "S", "how long relaunches may wait for the run lock an earlier launch "
                                "still holds (past NFSv4's 90 s lease)"),
    ("--max-relaunches", int, "N", "give up after this many relaunches for losses and crashes "
                                   "within --relaunch-window (rejoins are not counted)"),
    ("--relaunch-window", float, "S", "the span of the rolling relaunch budget, seconds"),
    ("--max-crashes", int, "N", "relaunch a job that crashed (exit 1) at most this many times "
                                "within --relaunch-window"),
)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m wagma_rl.elastic",
        description="Run a training job and keep it going when ranks are lost: relaunch it on the "
                    "slots that are left (it resumes from the state its survivors saved), and on "
                    "every slot again when the lost hosts answer. See docs/faults.md.",
        epilog="examples:\n"
               "  python -m wagma_rl.elastic --hosts node1,node2 --ppn 8 -- python run_ddppo.py "
               "--config configs/wagma_pointnav.yaml\n"
               "  in an sbatch script: python -m wagma_rl.elastic --slurm -- python run_ddppo.py "
               "...",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="HOST[:SLOTS],... for mpiexec (slots default to --ppn)")
    where.add_argument("--slurm", action="store_true",
                       help="inside an allocation: its nodes and tasks are the slots, started with "
                            "srun --mpi=pmi2 (or with --launcher, e.g. Open MPI's mpirun)")
    ap.add_argument("--ppn", type=int, default=1, help="ranks per host for --hosts (default 1)")
    ap.add_argument("--launcher", default=None,
                    help="the launcher and its options that reach the hosts: Hydra's mpiexec "
                         "(MPICH; default: mpiexec, or srun with --slurm) or Open MPI's mpirun, "
                         "told apart by its --version (with --with-ft ulfm a lost rank is "
                         "survived in place)")
    defaults = {k: v.default for k, v in inspect.signature(Supervisor).parameters.items()}
    for flag, kind, metavar, text in _OPTIONS:
        default = defaults[flag[2:].replace("-", "_")]
        ap.add_argument(flag, type=kind, default=default, metavar=metavar,
                        help=f"{text} (default {default:g})")
    ap.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                    help="folder for the job's loss records (default: a temporary folder; on a "
                         "cluster give one on the shared file system)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.ppn < 1 or min(args.max_relaunches, args.max_crashes, args.rejoin_after,
                           args.lock_wait) < 0 or args.max_flaps < 1 or \
            min(args.probe_timeout, args.relaunch_window, args.dead_after, args.watchdog) <= 0:
        ap.error("--ppn and --max-flaps must be >= 1; --max-relaunches, --max-crashes, "
                 "--rejoin-after and --lock-wait >= 0; --probe-timeout, --relaunch-window, "
                 "--dead-after and --watchdog > 0")
    if not command:
        ap.error("give the job's command after --, e.g. -- python run_ddppo.py --config FILE")
    try:
        if args.slurm and args.launcher is None:
            launcher = Launcher(["srun", "--mpi=pmi2"], kind="srun")
        else:
            launcher = Launcher.detect(shlex.split(args.launcher or "mpiexec"))
            launcher.probe_with_srun = args.slurm
            if launcher.kind == "openmpi" and "--with-ft" not in launcher.prefix:
                print("python -m wagma_rl.elastic: note: Open MPI's mpirun without \"--with-ft ulfm\": "
                      "a lost rank ends the launch and costs a relaunch; with it the survivors go "
                      "on in place", file=sys.stderr, flush=True)
        slots = slurm_slots() if args.slurm else parse_hosts(args.hosts, args.ppn)
        names = [flag[2:].replace("-", "_") for flag, *_ in _OPTIONS]
        return Supervisor(launcher, slots, command, state_dir=args.state_dir,
                          **{name: getattr(args, name) for name in names}).run()
    except SupervisorError as exc:
        print(f"python -m wagma_rl.elastic: error: {exc}", file=sys.stderr)
        return CONFIG_EXIT if isinstance(exc, SupervisorSetupError) else TIMEOUT_EXIT
