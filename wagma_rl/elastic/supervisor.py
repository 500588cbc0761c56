"""The supervisor: run a job, relaunch it on the slots that are left when ranks are lost, and on
every slot again when the lost hosts answer.

It is not a daemon on the nodes and not a transport: it runs where ``mpiexec`` (or the batch
script's ``srun``) would run, starts the job through the same launcher, and reads the loss records
the job's survivors write (:mod:`wagma_rl.elastic`). A launch's ranks are placed in slot order
(host by host), so the supervisor knows which host each rank was on.

Decisions, in order, when a launch ends:

* the job spent its frame budget (``finished.json``): done, exit 0;
* a user's stop signal reached the supervisor: passed on to the job, no relaunch;
* it stopped because the supervisor asked (lost hosts answer again, ``stopped.json``): relaunch on
  every slot;
* a survivor wrote a loss record: take the lost ranks' slots out (quarantine) and relaunch on the
  rest, which resume from the state the survivors saved (the RL trainer) or from the job's newest
  checkpoint (any other job of the project's exit policy, ``wagma_rl.job.exits.run_main``);
* a configuration error, non-finite values, a crash, an interrupt (exit 2, 4, 1, 130) or a clean
  stop (0): stop with the job's exit status and one line saying why;
* anything else (the launcher ended every rank, e.g. Hydra when a node's proxy dies): probe the
  hosts through the launcher, take out those that do not answer, relaunch on the rest from the
  job's newest checkpoint.

A lost host is tried again (a probe through the launcher) ``rejoin_after`` seconds after it was
taken out; when it answers, the job is asked to stop at its next synchronised update
(:func:`wagma_rl.elastic.request_rejoin`) and is relaunched on every slot.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from . import (ELASTIC_DIR_ENV, HYDRA_NOTIFIES_ENV, clear, finished, read_losses, request_rejoin,
               stopped_for_rejoin, write_launch_note)

__all__ = ["Launcher", "Supervisor", "SupervisorError", "SupervisorSetupError", "parse_hosts",
           "slurm_slots"]

TIMEOUT_EXIT = 3  # wagma_rl.job.exits.EXIT_CODES["timeout"]: ranks were lost
CONFIG_EXIT = 2  # wagma_rl.job.exits.EXIT_CODES["config"]: the supervisor's own setup is wrong
#: Exit statuses after which a relaunch could only repeat the failure (wagma_rl.job.exits.EXIT_CODES).
STOP_CODES = {0: "stopped by a signal", 1: "a crash", 2: "a configuration error",
              4: "non-finite values", 130: "interrupted"}


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
    hosts, e.g. ``-launcher ssh``) or ``srun`` inside an allocation."""

    prefix: list[str]
    kind: str = "mpiexec"  # or "srun"

    def command(self, slots: dict[str, int], argv: Sequence[str], hostfile: Path) -> list[str]:
        hosts = [h for h, n in slots.items() if n > 0]
        total = sum(slots.values())
        if self.kind == "srun":
            # One line per rank, in rank order: srun places exactly that (--distribution=arbitrary).
            hostfile.write_text("".join(f"{h}\n" * n for h, n in slots.items() if n > 0))
            # (SLURM_HOSTFILE names it; the supervisor sets it for the launch.)
            return [*self.prefix, "--kill-on-bad-exit=0", f"--nodes={len(hosts)}",
                    f"--ntasks={total}", "--distribution=arbitrary", *argv]
        # -disable-auto-cleanup: Hydra lets the survivors of a lost rank run on, so that they
        # save their state and record the loss instead of being killed.
        return [*self.prefix, "-disable-auto-cleanup", "-hosts",
                ",".join(f"{h}:{n}" for h, n in slots.items() if n > 0), "-n", str(total), *argv]

    def probe(self, host: str) -> list[str]:
        """A command that succeeds when ``host`` can run a rank again."""
        if self.kind == "srun":  # (--overlap: beside the job's own step, on its resources)
            return [*self.prefix, "--overlap", f"--nodelist={host}", "--nodes=1", "--ntasks=1",
                    "true"]
        return [*self.prefix, "-hosts", host, "-n", "1", "true"]

    def stop(self, proc: subprocess.Popen) -> None:
        """End a launch whose survivors have saved their state (a rank that never exits, e.g. a
        stopped one, would keep it waiting)."""
        if self.kind == "srun":  # two SIGINTs within a second: srun ends the job step
            for _ in range(2):
                _signal(proc, signal.SIGINT)
                time.sleep(0.2)
            try:
                proc.wait(timeout=30)
                return
            except subprocess.TimeoutExpired:
                pass
        _signal(proc, signal.SIGKILL, group=True)


def _signal(proc: subprocess.Popen, sig: int, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    """Run ``argv`` on ``slots`` (host -> ranks) through ``launcher`` until it finishes."""

    def __init__(self, launcher: Launcher, slots: dict[str, int], argv: Sequence[str], *,
                 state_dir: Path | None = None, rejoin_after: float = 60.0,
                 probe_timeout: float = 30.0, max_relaunches: int = 10, grace: float = 3.0,
                 say=None):
        self.launcher = launcher
        self.full = dict(slots)
        self.slots = dict(slots)
        self.argv = list(argv)
        self.dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="wagma-elastic-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rejoin_after = rejoin_after
        self.probe_timeout = probe_timeout
        self.max_relaunches = max_relaunches
        self.grace = grace
        self.say = say or (lambda line: print(f"elastic [{time.strftime('%H:%M:%S')}]: {line}",
                                              file=sys.stderr, flush=True))
        self.out_since: dict[str, float] = {}  # host -> when its slots were taken out
        self.events: list[dict] = []  # what happened, for the caller and the tests
        self._user_signal: int | None = None
        self._proc: subprocess.Popen | None = None

    # ------------------------------------------------------------------------------- the loop
    def run(self) -> int:
        relaunches = 0
        old = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT,
                                                            signal.SIGUSR1)}
        try:
            while True:
                rc, rejoining = self._launch_once()
                losses = read_losses(self.dir)
                if finished(self.dir):
                    return 0
                if self._user_signal is not None:
                    self.say(f"stopped by signal {signal.Signals(self._user_signal).name} "
                             f"(exit status {rc})")
                    return rc
                if rejoining and stopped_for_rejoin(self.dir):
                    for host in rejoining:
                        self.slots[host] = self.full[host]
                        self.out_since.pop(host, None)
                    self.events.append({"event": "rejoin", "hosts": rejoining, "at": time.time()})
                    self._note(f"{', '.join(rejoining)} rejoined", self._ended_at,
                               since="the job stopped for them")
                elif losses:
                    self._take_out(losses[0])
                elif rc in STOP_CODES:
                    if rc != 0:
                        self.say(f"the job stopped with exit status {rc} ({STOP_CODES[rc]}): not "
                                 "relaunched; see its output and log.txt")
                    return rc
                else:
                    self._launch_lost(rc)
                relaunches += 1
                if relaunches > self.max_relaunches:
                    self.say(f"gave up after {self.max_relaunches} relaunches (--max-relaunches)")
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

    def _take_out(self, record: dict) -> None:
        if record.get("state_error"):
            raise SupervisorError(
                f"ranks were lost and the survivors could not save their state "
                f"({record['state_error']}); the job stopped: fix that, then resume it from its "
                "newest checkpoint")
        placement = [h for h, n in self.slots.items() for _ in range(n)]
        now = time.time()
        lost = []
        for peer in record["lost"]:
            if 0 <= peer["rank"] < len(placement):
                host = placement[peer["rank"]]
                self.slots[host] -= 1
                self.out_since[host] = now
                lost.append(f"rank {peer['rank']} ({host})")
        if sum(self.slots.values()) == 0:
            raise SupervisorError("every rank was lost; resume the job from its newest "
                                  "checkpoint when the hosts are back")
        self.events.append({"event": "loss", "ranks": [p["rank"] for p in record["lost"]],
                            "detected_at": record["detected_at"], "at": now,
                            "checkpoint": record["checkpoint"]})
        saved = (f"the survivors saved update {record['update']} ({record['frames']} frames)"
                 if record.get("checkpoint") else "going on from the newest checkpoint")
        self._note(f"lost {', '.join(lost) or 'ranks'} (found by rank {record['writer']}); {saved}",
                   record["detected_at"])

    def _launch_lost(self, rc: int) -> None:
        """The launch ended without the survivors' record: the launcher ended every rank (Hydra
        does when a node's proxy dies; MPICH's shared-memory transport ends a node's ranks when
        one of them is killed). Hosts that do not answer a probe are taken out; the job goes on
        from its newest checkpoint on the rest."""
        env = dict(os.environ)
        hosts = [h for h, n in self.slots.items() if n > 0]
        probes = {h: subprocess.Popen(self.launcher.probe(h), env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
                  for h in hosts}
        end = time.monotonic() + self.probe_timeout
        while time.monotonic() < end and any(p.poll() is None for p in probes.values()):
            time.sleep(0.1)
        gone = []
        for host, p in probes.items():
            if p.poll() != 0:
                _signal(p, signal.SIGKILL, group=True)
                p.wait()
                gone.append(host)
        now = time.time()
        if len(gone) == len(hosts):
            raise SupervisorError(f"the job ended (exit status {rc}) and none of its hosts "
                                  f"({', '.join(hosts)}) answers; resume it from its newest "
                                  "checkpoint when they are back")
        for host in gone:
            self.slots[host] = 0
            self.out_since[host] = now
        self.events.append({"event": "restart", "hosts_out": gone, "rc": rc, "at": now})
        why = (f"{', '.join(gone)} did not answer" if gone else
               "every host answers (a rank was lost on one of them)")
        self._note(f"the job ended (exit status {rc}) without a record from survivors: {why}; "
                   "going on from the newest checkpoint", self._ended_at, since="the job ended")

    def _note(self, why: str, detected_at: float, since: str = "the loss was detected") -> None:
        """Say why the job is relaunched, here and (through the launch note) in its log."""
        line = f"{why}; relaunching on {self._describe()}"
        self.say(line)
        write_launch_note(self.dir, reason=line, detected_at=detected_at, since=since,
                          world_size=sum(self.slots.values()))

    def _describe(self) -> str:
        hosts = ",".join(f"{h}:{n}" for h, n in self.slots.items() if n > 0)
        return f"{sum(self.slots.values())} ranks ({hosts})"

    def _launch_once(self) -> tuple[int, list[str]]:
        """One launch to its end; returns (exit status, hosts asked to rejoin)."""
        clear(self.dir)
        env = dict(os.environ, **{ELASTIC_DIR_ENV: str(self.dir)})
        hostfile = self.dir / "hostfile"
        if self.launcher.kind == "srun":
            env["SLURM_HOSTFILE"] = str(hostfile)
        else:
            env[HYDRA_NOTIFIES_ENV] = "1"
        cmd = self.launcher.command(self.slots, self.argv, hostfile)
        self.events.append({"event": "launch", "ranks": sum(self.slots.values()), "at": time.time()})
        try:
            proc = self._proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        except OSError as exc:
            raise SupervisorSetupError(f"cannot start the launcher '{cmd[0]}': {exc.strerror}; give its "
                                  "path with --launcher (or activate the environment that has it)")
        probe: tuple[subprocess.Popen, list[str], float] | None = None
        rejoining: list[str] = []
        lost_seen: float | None = None
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.time()
            if lost_seen is None and read_losses(self.dir):
                lost_seen = now
            if lost_seen is not None and now - lost_seen > self.grace:
                self.launcher.stop(proc)  # the survivors have saved and reported: end the rest
                break
            if probe is None and not rejoining:
                ready = [h for h, t in self.out_since.items() if now - t >= self.rejoin_after]
                if ready:
                    probe = (subprocess.Popen(self.launcher.probe(ready[0]), env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True), ready, now)
            elif probe is not None:
                p, hosts, started = probe
                if p.poll() is None and now - started < self.probe_timeout:
                    continue
                if p.poll() == 0:
                    rejoining = hosts
                    request_rejoin(self.dir, hosts)
                    self.say(f"{', '.join(hosts)} answer again: asking the job to stop at its next "
                             "synchronised update for a relaunch")
                else:
                    _signal(p, signal.SIGKILL, group=True)
                    p.wait()
                    for h in hosts:  # try again after another quarantine period
                        self.out_since[h] = now
                probe = None
        rc = proc.wait()
        self._ended_at = time.time()
        # What the launcher left on this host (e.g. ranks of a launcher that died) must not hold
        # the run folder's lock against the next launch.
        _signal(proc, signal.SIGKILL, group=True)
        if probe is not None:
            _signal(probe[0], signal.SIGKILL, group=True)
            probe[0].wait()
        self._proc = None
        return rc, rejoining

    def _forward(self, signum, frame) -> None:
        """A stop signal for the supervisor is for the job: pass it on, relaunch no more."""
        self._user_signal = signum
        if self._proc is not None:
            _signal(self._proc, signum)


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
                       help="inside an allocation: srun --mpi=pmi2 on the allocation's nodes")
    ap.add_argument("--ppn", type=int, default=1, help="ranks per host for --hosts (default 1)")
    ap.add_argument("--launcher", default="mpiexec",
                    help="the mpiexec command and options that reach the hosts (default: mpiexec)")
    ap.add_argument("--rejoin-after", type=float, default=60.0, metavar="S",
                    help="seconds a lost host stays out before it is tried again (default 60)")
    ap.add_argument("--probe-timeout", type=float, default=30.0, metavar="S",
                    help="seconds a host has to start a process before it counts as gone "
                         "(default 30)")
    ap.add_argument("--max-relaunches", type=int, default=10, metavar="N",
                    help="give up after this many relaunches (default 10)")
    ap.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                    help="folder for the job's loss records (default: a temporary folder; on a "
                         "cluster give one on the shared file system)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.ppn < 1 or args.max_relaunches < 0 or args.rejoin_after < 0 or args.probe_timeout <= 0:
        ap.error("--ppn must be >= 1, --max-relaunches and --rejoin-after >= 0, --probe-timeout > 0")
    if not command:
        ap.error("give the job's command after --, e.g. -- python run_ddppo.py --config FILE")
    try:
        if args.slurm:
            launcher = Launcher(["srun", "--mpi=pmi2"], kind="srun")
            slots = slurm_slots()
        else:
            launcher = Launcher(shlex.split(args.launcher))
            slots = parse_hosts(args.hosts, args.ppn)
        return Supervisor(launcher, slots, command, state_dir=args.state_dir,
                          rejoin_after=args.rejoin_after, probe_timeout=args.probe_timeout,
                          max_relaunches=args.max_relaunches).run()
    except SupervisorError as exc:
        print(f"python -m wagma_rl.elastic: error: {exc}", file=sys.stderr)
        return CONFIG_EXIT if isinstance(exc, SupervisorSetupError) else TIMEOUT_EXIT
