"""A cluster of N nodes on one machine, for tests and benchmarks that must cross a network.

Each node is a Linux network namespace with one veth link to a switch (a bridge in a namespace of
its own), an address that exists only inside these namespaces, its own ``/etc/netns/<ns>/hosts``
(``ip netns exec`` binds it over ``/etc/hosts``) and, for every process started in it, a fresh UTS
namespace carrying the node's hostname. MPI therefore sees separate hosts and takes its network
path (TCP over the veth links) between them instead of shared memory.

MPICH's Hydra enters a node through the launcher script this tool writes::

    python -m cluster.netns up --nodes 2 [--rate 10gbit]
    python -m cluster.netns exec n0 -- mpiexec -launcher ssh -launcher-exec \
        /run/wagma-cluster/wagma/launch -hosts n0,n1 -ppn 2 -n 4 python prog.py
    python -m cluster.netns down

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN). Links can be rate-limited with ``tc`` (tbf); this
machine's kernel has no ``netem``, so delay and loss cannot be emulated here (``shape`` says so).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from native_coll.mpienv import mpiexec_path, with_netmod

__all__ = ["Cluster", "ClusterError", "available", "up", "down", "load"]

STATE_ROOT = Path(os.environ.get("WAGMA_CLUSTER_STATE", "/run/wagma-cluster"))
SUBNET = "10.213"  # 10.213.<cluster index>.<node>: addresses that exist only inside our namespaces


class ClusterError(RuntimeError):
    """A cluster could not be made, used or removed; the message says what to do."""


def _run(cmd: list[str], *, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def available() -> str | None:
    """Return None when namespaced nodes can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "namespaced nodes need root (network namespaces, veth links)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: iproute2 / util-linux)"
    probe = f"wgprobe{os.getpid()}"
    proc = _run(["ip", "netns", "add", probe], check=False)
    if proc.returncode != 0:
        return f"cannot create a network namespace: {proc.stderr.strip()}"
    try:
        proc = _run(["ip", "netns", "exec", probe, "unshare", "--uts", "true"], check=False)
        if proc.returncode != 0:
            return f"cannot create a UTS namespace: {proc.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


@dataclass
class Cluster:
    """A made cluster: its name, node hostnames, their addresses and namespace names."""

    name: str
    index: int
    nodes: list[str]
    addresses: list[str]
    rate: str | None = None
    state_dir: str = ""
    namespaces: list[str] = field(default_factory=list)

    @property
    def switch_ns(self) -> str:
        return f"{self.name}-sw"

    @property
    def launcher(self) -> str:
        """Path of the script Hydra's ``-launcher-exec`` calls to start a proxy on a node."""
        return str(Path(self.state_dir) / "launch")

    def ns_of(self, node: str) -> str:
        try:
            return self.namespaces[self.nodes.index(node)]
        except ValueError:
            raise ClusterError(f"no node {node!r} in cluster {self.name!r} (nodes: "
                               f"{', '.join(self.nodes)})") from None

    def node_command(self, node: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on ``node`` (its network, hosts file and hostname)."""
        return ["ip", "netns", "exec", self.ns_of(node), "unshare", "--uts", "sh", "-c",
                f'hostname {shlex.quote(node)} && exec "$@"', "sh", *argv]

    def mpiexec_args(self, *, ppn: int, nodes: list[str] | None = None) -> list[str]:
        """Hydra's arguments that place ``ppn`` ranks on each node through this cluster's launcher."""
        hosts = nodes or self.nodes
        return ["-launcher", "ssh", "-launcher-exec", self.launcher, "-hosts", ",".join(hosts),
                "-ppn", str(ppn)]

    def switch_port(self, node: str) -> str:
        """The switch-side end of ``node``'s veth link."""
        self.ns_of(node)
        return f"{self.name[:6]}{self.index}p{self.nodes.index(node)}"

    def launch_command(self, mpiexec: str, nprocs: int, argv: list[str], *,
                       extra: tuple[str, ...] = ()) -> list[str]:
        """The command (run from the host) that starts ``argv`` on ``nprocs`` ranks spread evenly
        over the nodes, with mpiexec itself on the first node. ``extra`` goes to mpiexec."""
        nodes = len(self.nodes)
        if nprocs % nodes:
            raise ClusterError(f"{nprocs} ranks do not spread evenly over {nodes} nodes")
        cmd = [mpiexec, *extra, *self.mpiexec_args(ppn=nprocs // nodes), "-n", str(nprocs), *argv]
        return self.node_command(self.nodes[0], cmd)

    def link(self, node: str, *, up: bool) -> None:
        """Connect or disconnect ``node``'s cable at the switch. The node keeps its address and
        routes (its side only loses carrier), so TCP connections retransmit instead of failing:
        what a cut cable or a dead switch port does to a cluster node."""
        _run(["ip", "netns", "exec", self.switch_ns, "ip", "link", "set", self.switch_port(node),
              "up" if up else "down"])

    def shape(self, node: str, *, rate: str | None) -> None:
        """Limit the egress rate of ``node``'s link (tbf), or remove the limit with rate=None."""
        ns = self.ns_of(node)
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        if rate:
            # burst must hold at least one jiffy of traffic at the rate; 1 MiB covers 10 Gbit/s.
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                  "rate", rate, "burst", "1mb", "latency", "50ms"])

    def pids(self, node: str) -> list[int]:
        """PIDs of the processes that live in ``node``'s network namespace."""
        proc = _run(["ip", "netns", "pids", self.ns_of(node)], check=False)
        return [int(p) for p in proc.stdout.split()]


def _index_for(name: str) -> int:
    taken = set()
    if STATE_ROOT.exists():
        for f in STATE_ROOT.glob("*/cluster.json"):
            try:
                c = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if c.get("name") != name:
                taken.add(c.get("index"))
    for i in range(1, 250):
        if i not in taken:
            return i
    raise ClusterError("too many clusters are up: remove some with `python -m cluster.netns down`")


LAUNCHER = """#!/bin/sh
# Hydra's -launcher-exec for cluster {name}: called like ssh ([options] host command...), it runs
# the command in that node's namespaces. Written by cluster/netns.py; removed by `down`.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "cluster {name}: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host && exec sh -c \\"\\$0\\"" "$*"
"""


def up(nodes: int = 2, *, name: str = "wagma", rate: str | None = None) -> Cluster:
    """Make a cluster of ``nodes`` nodes named n0..n{N-1}; replaces one of the same name."""
    why = available()
    if why:
        raise ClusterError(f"cannot make namespaced nodes here: {why}")
    if nodes < 1 or nodes > 64:
        raise ClusterError(f"--nodes must be between 1 and 64, got {nodes}")
    down(name=name)
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    # One cluster made at a time (the index and the record under one lock): two made at once
    # (two test workers) must not take the same index, whose link names would collide.
    guard = os.open(STATE_ROOT / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        index = _index_for(name)
        state = STATE_ROOT / name
        state.mkdir(parents=True, exist_ok=True)
        hosts = [f"n{i}" for i in range(nodes)]
        addrs = [f"{SUBNET}.{index}.{i + 1}" for i in range(nodes)]
        c = Cluster(name=name, index=index, nodes=hosts, addresses=addrs, rate=rate,
                    state_dir=str(state), namespaces=[f"{name}-{h}" for h in hosts])
        # Record first so `down` can remove a half-made cluster.
        (state / "cluster.json").write_text(json.dumps(asdict(c)))
    finally:
        os.close(guard)
    sw = c.switch_ns
    _run(["ip", "netns", "add", sw])
    _run(["ip", "netns", "exec", sw, "ip", "link", "add", "br0", "type", "bridge"])
    _run(["ip", "netns", "exec", sw, "ip", "link", "set", "br0", "up"])
    hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(addrs, hosts))
    for i, (host, addr, ns) in enumerate(zip(hosts, addrs, c.namespaces)):
        _run(["ip", "netns", "add", ns])
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        (etc / "hostname").write_text(host + "\n")
        peer = c.switch_port(host)
        _run(["ip", "link", "add", peer, "type", "veth", "peer", "name", f"{name[:6]}{index}e{i}"])
        _run(["ip", "link", "set", f"{name[:6]}{index}e{i}", "netns", ns])
        _run(["ip", "link", "set", peer, "netns", sw])
        _run(["ip", "netns", "exec", sw, "ip", "link", "set", peer, "master", "br0"])
        _run(["ip", "netns", "exec", sw, "ip", "link", "set", peer, "up"])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", f"{name[:6]}{index}e{i}", "name",
              "eth0"])
        _run(["ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0"])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up"])
        _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        if rate:
            c.shape(host, rate=rate)
    cases = "\n".join(f"  {h}) ns={ns} ;;" for h, ns in zip(hosts, c.namespaces))
    launcher = Path(c.launcher)
    launcher.write_text(LAUNCHER.format(name=name, cases=cases))
    launcher.chmod(0o755)
    return c


def load(name: str = "wagma") -> Cluster:
    """The cluster ``name`` made earlier by :func:`up`."""
    f = STATE_ROOT / name / "cluster.json"
    if not f.exists():
        raise ClusterError(f"no cluster {name!r} is up: run `python -m cluster.netns up`")
    return Cluster(**json.loads(f.read_text()))


def down(*, name: str = "wagma") -> bool:
    """Remove cluster ``name``: ends the processes left in its nodes, deletes what :func:`up` made.

    Returns False when there was nothing to remove.
    """
    f = STATE_ROOT / name / "cluster.json"
    if not f.exists():
        return False
    try:
        c = Cluster(**json.loads(f.read_text()))
    except (OSError, ValueError, TypeError):
        shutil.rmtree(f.parent, ignore_errors=True)
        return False
    for ns in [*c.namespaces, c.switch_ns]:
        for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        _run(["ip", "netns", "del", ns], check=False)  # the veth pairs go with their namespaces
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    shutil.rmtree(f.parent, ignore_errors=True)
    return True


def _run_program(args) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ClusterError("run needs a program: run [--nodes N --ppn K] -- PROGRAM ARGS")
    if argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    mpiexec = mpiexec_path()
    c = up(args.nodes, name=f"{args.name}run", rate=args.rate)
    try:
        env = with_netmod(dict(os.environ))
        env.setdefault("OMP_NUM_THREADS", "1")
        return subprocess.call(c.launch_command(mpiexec, args.nodes * args.ppn, argv), env=env)
    finally:
        down(name=c.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cluster.netns", description=__doc__.split("\n")[0])
    p.add_argument("--name", default="wagma", help="cluster name (several can be up at once)")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make the nodes")
    u.add_argument("--nodes", type=int, default=2)
    u.add_argument("--rate", default=None, help="egress rate limit per node, tc syntax (10gbit)")
    sub.add_parser("down", help="remove the nodes and everything running in them")
    sub.add_parser("show", help="print the cluster as JSON")
    e = sub.add_parser("exec", help="run a command on a node")
    e.add_argument("node")
    e.add_argument("argv", nargs=argparse.REMAINDER)
    r = sub.add_parser("run", help="make a cluster, run a program on every node under mpiexec "
                                   "(OFI netmod), remove the cluster")
    r.add_argument("--nodes", type=int, default=2)
    r.add_argument("--ppn", type=int, default=2, help="ranks per node")
    r.add_argument("--rate", default=None, help="egress rate limit per node, tc syntax (10gbit)")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS (python is implied "
                                                          "for a .py file)")
    lk = sub.add_parser("link", help="bring a node's link up or down")
    lk.add_argument("node")
    lk.add_argument("state", choices=["up", "down"])
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":
            c = up(args.nodes, name=args.name, rate=args.rate)
            print(f"cluster {c.name}: " + ", ".join(f"{h}={a}" for h, a in zip(c.nodes, c.addresses))
                  + f"; launcher {c.launcher}")
        elif args.cmd == "down":
            print(f"cluster {args.name}: " + ("removed" if down(name=args.name) else "was not up"))
        elif args.cmd == "show":
            print(json.dumps(asdict(load(args.name)), indent=2))
        elif args.cmd == "exec":
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv_:
                raise ClusterError("exec needs a command: exec NODE -- COMMAND ...")
            return subprocess.call(load(args.name).node_command(args.node, argv_))
        elif args.cmd == "run":
            return _run_program(args)
        elif args.cmd == "link":
            load(args.name).link(args.node, up=args.state == "up")
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
