"""A Ray cluster on this machine's loopback, for tests and benchmarks: a head and N-1 more
nodes (separate raylets, so tasks cross node boundaries), each `ray start --block` in its own
process group under a private temp dir, with no dashboard, no usage statistics, no metrics
export and every port on 127.0.0.1.

Why a launcher (`python -m ragkit.cluster.local node ...`) and not `ray start` itself: Ray
swaps a node address of 127.0.0.1 for the machine's outward address ("so other machines can
reach it") and then binds its servers there. The launcher makes Ray's own address lookup
answer the node's `--node-ip-address` (127.0.0.1 unless given), so on loopback the GCS, the
raylets, the object managers and the agents listen on loopback only (checked with `ss -ltnp`),
and on a host of several (tests/hosts.py) on that host's own address. It also sets Ray's gRPC
keepalive for every process of the node (`connect.RAY_KEEPALIVE_ENV`: a node that vanishes
must not hang its tasks' owners)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.cluster.connect import RAY_KEEPALIVE_ENV, RAY_OFFLINE_ENV

WORKER_ENV = {"RAY_worker_niceness": "0"}

# Ports this process has handed out: bind(0) may give a port again once its socket is closed,
# and Ray refuses two components on one port ("dashboard_agent_grpc is trying to use a port
# number 40409 that is used by other components", seen in CI)
_GIVEN: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this process handed out before."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free loopback port that was not handed out already")


def _node_args(temp_dir: Path, cpus: int) -> list[str]:
    return [
        "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", f"--temp-dir={temp_dir}",
        "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}", "--include-log-monitor=false",
    ]


@dataclass
class LocalCluster:
    address: str
    temp_dir: Path
    client_address: str = ""  # the head's Ray Client server, ray://127.0.0.1:PORT
    procs: list[subprocess.Popen] = field(default_factory=list)

    def processes(self) -> list:
        """Every live process of the cluster: the launchers and all their descendants (the
        raylets start their workers in sessions of their own, so a process group is not enough)."""
        import psutil

        out = []
        for p in self.procs:
            try:
                root = psutil.Process(p.pid)
                out += [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return [q for q in out if _alive(q)]

    def stop(self, grace_s: float = 10.0) -> None:
        """End every node: its process group (raylet, GCS, agents) and every descendant
        (workers, actors), TERM then KILL."""
        import psutil

        procs = self.processes()
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: workers outlive their `ray start`
            except ProcessLookupError:
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for q in procs:
            try:
                if _alive(q):
                    q.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start(temp_dir: Path, nodes: int = 2, cpus_per_node: int = 1, timeout_s: float = 90.0,
          wrap: Callable[[int], list[str]] | None = None) -> LocalCluster:
    """Start a loopback cluster of `nodes` nodes and wait until all of them are alive.
    `wrap(i)`, when given, is a command line node i's launcher runs under (the tests trace
    every process of the cluster with `strace -f -o LOG`)."""
    temp_dir = Path(temp_dir)
    temp_dir.mkdir(parents=True, exist_ok=True)
    # Ray runs its workers at nice 15 (its worker_niceness), below every process at 0: on a
    # machine that also runs the driver (its store writes, Chroma's threads), the embedder actor
    # then waits for the driver's CPU. This cluster's nodes share the driver's machine: workers
    # at the driver's priority (README "On a Ray cluster" says the same for `ray start`).
    env = dict(os.environ, **RAY_OFFLINE_ENV, **WORKER_ENV)  # the launcher adds RAY_KEEPALIVE_ENV (_node_main)
    port = free_port()
    client_port = free_port()
    cluster = LocalCluster(address=f"127.0.0.1:{port}", temp_dir=temp_dir, client_address=f"ray://127.0.0.1:{client_port}")
    launcher = [sys.executable, "-m", "ragkit.cluster.local", "node"]
    try:
        for i in range(nodes):
            if i == 0:
                args = ["--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={client_port}"]
            else:
                args = [f"--address={cluster.address}"]
            log = open(temp_dir / f"node{i}.log", "wb")
            argv = (wrap(i) if wrap else []) + launcher + args + _node_args(temp_dir, cpus_per_node)
            cluster.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            log.close()
            if i == 0:
                _wait_port(port, timeout_s, cluster, temp_dir)
        _wait_nodes(cluster, nodes, timeout_s, temp_dir)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _logs(temp_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(temp_dir.glob("node*.log")))


def _wait_port(port: int, timeout_s: float, cluster: LocalCluster, temp_dir: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.procs[0].poll() is not None:
            raise RuntimeError(f"the Ray head exited: {_logs(temp_dir)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the Ray head did not listen in {timeout_s:.0f} s: {_logs(temp_dir)}")


def _wait_nodes(cluster: LocalCluster, n: int, timeout_s: float, temp_dir: Path) -> None:
    """Count the alive nodes from a short-lived driver in a child (this process stays free to
    connect later, or not)."""
    code = ("import sys, time, ray\n"
            "import ray._private.ray_constants as c\n"
            "c.ENABLE_RAY_CLUSTER = False\n"
            f"ray.init(address={cluster.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            f"while sum(1 for x in ray.nodes() if x['Alive']) < {n} and time.monotonic() < deadline:\n"
            "    time.sleep(0.3)\n"
            f"sys.exit(0 if sum(1 for x in ray.nodes() if x['Alive']) >= {n} else 1)\n")
    env = dict(os.environ, **RAY_OFFLINE_ENV)
    try:
        rc = subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout_s + 30, capture_output=True).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    if rc != 0:
        raise RuntimeError(f"the local Ray cluster did not reach {n} alive nodes: {_logs(temp_dir)}")


# The node's own address, as its launcher was given it (`--node-ip-address`), for the Python
# processes Ray starts for the node: they inherit the launcher's environment
NODE_IP_ENV = "RAGKIT_RAY_NODE_IP"


def _node_ip(argv: list[str]) -> str:
    """The `--node-ip-address` among `ray start` options (127.0.0.1 when none is given)."""
    for i, a in enumerate(argv):
        if a.startswith("--node-ip-address="):
            return a.split("=", 1)[1]
        if a == "--node-ip-address" and i + 1 < len(argv):
            return argv[i + 1]
    return "127.0.0.1"


def _loopback_only() -> None:
    """In this process: Ray's address lookup answers the node's own address (the launcher's
    `--node-ip-address`, 127.0.0.1 unless given; instead of a UDP connect towards 8.8.8.8,
    which on a host with no default route fails and leaves Ray guessing), its cloud-provider
    probe (HTTP to 169.254.169.254 and metadata.google.internal, which Ray's UsageStatsHead
    runs even with usage statistics disabled) answers "unknown" without a request, and no
    usage report is posted."""
    import ray._common.usage.usage_lib as usage_lib
    import ray._private.services as services

    ip = os.environ.get(NODE_IP_ENV, "127.0.0.1")
    services.node_ip_address_from_perspective = lambda address=None: ip
    try:
        import ray._common.network_utils as network_utils

        network_utils.node_ip_address_from_perspective = services.node_ip_address_from_perspective
    except (ImportError, AttributeError):
        pass
    usage_lib.get_cloud_from_metadata_requests = lambda: "unknown"
    # with usage statistics disabled, UsageStatsHead still posts a "disabled" report to
    # https://usage-stats.ray.io/ (a name lookup, then HTTPS): no report is sent at all
    usage_lib.UsageReportClient.report_usage_data = lambda self, url, data: None


def _client_server_through_shim() -> None:
    """The Ray Client server (`ray://`: the head's proxy, and the specific server it starts for
    each client) runs as `python -m ray.util.client.server`: route it through `shim-module` so
    it, too, keeps its lookups on loopback (without it the specific server swaps 127.0.0.1
    for the machine's address and waits forever for a GCS there: tests/test_cluster.py)."""
    import ray._private.services as services

    if getattr(services.start_ray_process, "ragkit_shim", False):
        return
    start = services.start_ray_process

    def start_ray_process(command, *args, **kwargs):
        command = list(command)
        for i in range(len(command) - 1):
            if command[i] == "-m" and command[i + 1] == "ray.util.client.server":
                # "-m ray.util.client.server" stays in the command line: the proxy waits for a
                # specific server's process to show it (proxier._match_running_client_server)
                command[i + 1 : i + 2] = ["ragkit.cluster.local", "shim-module", "-m", "ray.util.client.server"]
                break
        return start(command, *args, **kwargs)

    start_ray_process.ragkit_shim = True
    services.start_ray_process = start_ray_process


def _node_main(argv: list[str]) -> None:
    """`ray start ARGS` with Ray's lookups kept on loopback (`_loopback_only`), in this process
    and in the Python processes Ray starts for the node (the dashboard process on the head,
    the dashboard and runtime-env agents on every node): their command lines go through
    `python -m ragkit.cluster.local shim SCRIPT ARGS`, which does the same before running SCRIPT
    (strace -f of the cluster caught both lookups: tests/test_cluster.py)."""
    import ray._private.services as services

    os.environ[NODE_IP_ENV] = _node_ip(argv)
    for k, v in RAY_KEEPALIVE_ENV.items():  # inherited by every process Ray starts for the node
        os.environ.setdefault(k, v)
    _loopback_only()
    _client_server_through_shim()
    build = services._build_python_executable_command_memory_profileable

    def through_shim(*args, **kwargs):
        return [*build(*args, **kwargs), "-m", "ragkit.cluster.local", "shim"]

    services._build_python_executable_command_memory_profileable = through_shim
    from ray.scripts.scripts import main

    sys.argv = ["ray", "start"] + argv
    main()


def _shim_main(argv: list[str]) -> None:
    import runpy

    _loopback_only()
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")


def _shim_module_main(argv: list[str]) -> None:
    """`python -m MODULE ARGS` (given as `-m MODULE ARGS`) with `_loopback_only` first (the
    Ray Client server)."""
    import runpy

    _loopback_only()
    _client_server_through_shim()  # the proxy starts a specific server per client the same way
    if argv[0] == "-m":
        argv = argv[1:]
    sys.argv = [argv[0]] + list(argv[1:])
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["node"]:
        _node_main(sys.argv[2:])
    elif sys.argv[1:2] == ["shim"] and len(sys.argv) > 2:
        _shim_main(sys.argv[2:])
    elif sys.argv[1:2] == ["shim-module"] and len(sys.argv) > 3:
        _shim_module_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m ragkit.cluster.local node [ray start options]")
