"""Separate hosts on one machine, for the tests that must not share a filesystem, a loopback
or a process table (`make cluster-test`, tests/test_hosts.py). Needs root (CI runs as root).

Each host is a Linux network namespace with one interface on a test range that exists only
inside the namespaces this module made (10.213.X.0/24, X from the process id): its veth ends
on a bridge in a namespace of its own (the "switch"), so there is no route, NAT or bridge to
the machine's own network, and the machine's own namespace holds no address of the range.
IPv6 is off on the hosts (no link-local addresses). Each host also has its own mount and UTS
and PID namespaces, held by an anchor process (PID 1 of its host, reaping orphans as
init does): its own process table (and /proc), a private tmpfs on /tmp (its working
directory, HOME and caches) and on /dev/shm (Ray's object store), its own host name, and
the rest of the filesystem read-only, so the installed code is the only thing hosts share
and the network is the only way from one to another.

A host's commands run as `nsenter -t ANCHOR -m -n -u -p -w ...` (in the anchor's /tmp/work). The harness (this
module, in the machine's own namespaces) reads and writes a host's /tmp through
`/proc/ANCHOR/root/tmp`, which is how a test puts a document on one host only.

`Hosts.close()` kills every process in every namespace it made and deletes the namespaces;
namespaces left by a run that was killed before its close (their names carry the dead
process's id) are removed by the next `Hosts()`."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rkh"

# PID 1 of a host: says it is ready, then reaps every orphan (Ray's daemons are re-parented to
# it) until it is killed
_INIT = """import os, time
print("ready", os.getpid(), flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""  # every namespace this module makes: rkh<pid>-<name>


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _netns(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _ip("netns", "exec", name, *args, check=check)


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def netns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(x) for x in out.split()]


def _remove(ns: str) -> None:
    for _ in range(3):
        pids = netns_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    _ip("netns", "del", ns, check=False)


def remove_stale() -> list[str]:
    """Namespaces of this module whose making process is gone (a run killed before its close)."""
    gone = []
    for ns in namespaces():
        m = re.match(rf"^{PREFIX}(\d+)-", ns)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _remove(ns)
            gone.append(ns)
    return gone


def available() -> str | None:
    """Why separate hosts cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "not root (network and mount namespaces need CAP_SYS_ADMIN / CAP_NET_ADMIN)"
    for tool in ("ip", "nsenter", "unshare", "nginx"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"{tool} is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    return None


@dataclass
class Host:
    name: str
    ns: str
    address: str
    anchor: subprocess.Popen | None = None  # `unshare --fork`, outside the host's PID namespace
    init: int = 0  # its child, PID 1 inside the host

    @property
    def root(self) -> Path:
        """This host's filesystem as the harness sees it (its /tmp is its own)."""
        return Path(f"/proc/{self.init}/root")

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def argv(self, cmd: list[str]) -> list[str]:
        # -w without a path: the anchor's working directory (/tmp/work), opened inside the host
        return ["nsenter", "-t", str(self.init), "-m", "-n", "-u", "-p", "-w", *cmd]

    def env(self, **extra: str) -> dict:
        """The harness's environment as a process on this host sees it: HOME, the caches and
        temp files in its own /tmp."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RAGKIT_"))}
        env.update(HOME="/tmp/home", TMPDIR="/tmp", XDG_CACHE_HOME="/tmp/home/.cache", PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def run(self, cmd: list[str], timeout: float = 300, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(cmd), env=env or self.env(), capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, cmd: list[str], log: str, env: dict | None = None, **kw) -> subprocess.Popen:
        """A long-running process on this host, its output to LOG in the host's /tmp."""
        out = open(self.path(log), "wb")
        try:
            return subprocess.Popen(self.argv(cmd), env=env or self.env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, **kw)
        finally:
            out.close()

    def pids(self) -> list[int]:
        """Every process on this host but its anchor and init."""
        return [p for p in netns_pids(self.ns) if p not in (self.anchor.pid, self.init)]

    def power_off(self) -> list[int]:
        """As a machine that loses its power: its link goes down first (the others hear no
        FIN or RST, only silence), then every process on it is killed with -9."""
        _netns(self.ns, "ip", "link", "set", "eth0", "down", check=False)
        killed = []
        for _ in range(5):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        return killed

    def listening(self) -> list[tuple[str, str, str]]:
        """(address, port, process) of every listening TCP/UDP socket in this host's namespace."""
        out = _netns(self.ns, "ss", "-Htlnup", check=False).stdout
        rows = []
        for ln in out.splitlines():
            parts = ln.split()
            if len(parts) < 5:
                continue
            local = parts[4]
            addr, _, port = local.rpartition(":")
            rows.append((addr.strip("[]").split("%")[0], port, " ".join(parts[6:])[:80]))
        return rows

    def interfaces(self) -> dict[str, list[str]]:
        out = _netns(self.ns, "ip", "-o", "addr", "show", check=False).stdout
        got: dict[str, list[str]] = {}
        for ln in out.splitlines():
            parts = ln.split()
            got.setdefault(parts[1], []).append(parts[3])
        return got


@dataclass
class Hosts:
    names: tuple[str, ...] = ("a", "b", "c", "d")
    hosts: dict[str, Host] = field(default_factory=dict)
    tag: str = ""
    subnet: str = ""

    def __post_init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        # a /24 of 10.213.0.0/16 by process id: two runs at once do not meet
        self.subnet = f"10.213.{os.getpid() % 250 + 1}"
        self.switch = f"{self.tag}-sw"

    @property
    def network(self) -> str:
        return f"{self.subnet}.0/24"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def start(self) -> "Hosts":
        remove_stale()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        _ip("netns", "add", self.switch)
        _netns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        _netns(self.switch, "ip", "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = f"{self.tag}-{name}"
            host = Host(name=name, ns=ns, address=f"{self.subnet}.{i + 2}")
            self.hosts[name] = host
            _ip("netns", "add", ns)
            outer, inner = f"{self.tag[:8]}{name}0"[:15], f"{self.tag[:8]}{name}1"[:15]
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "netns", self.switch)
            _ip("link", "set", inner, "netns", ns)
            _netns(self.switch, "ip", "link", "set", outer, "master", "br0")
            _netns(self.switch, "ip", "link", "set", outer, "up")
            for key in ("all", "default"):
                _netns(ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1")
            _netns(ns, "ip", "link", "set", inner, "name", "eth0")
            _netns(ns, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            _netns(ns, "ip", "link", "set", "eth0", "up")
            _netns(ns, "ip", "link", "set", "lo", "up")
            script = (f"hostname host-{name} && mount -t tmpfs -o mode=1777 tmpfs /tmp && "
                      "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -o remount,bind,ro / && "
                      f"mkdir -p /tmp/work /tmp/home && cd /tmp/work && exec {sys.executable} -c {shlex.quote(_INIT)}")
            host.anchor = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc",
                 "--propagation", "private", "sh", "-c", script],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            line = host.anchor.stdout.readline().strip()
            if not line.startswith("ready "):
                raise RuntimeError(f"host {name} did not start: {line} {host.anchor.stdout.read()[:500]}")
            import psutil

            kids = psutil.Process(host.anchor.pid).children()
            if len(kids) != 1:
                raise RuntimeError(f"host {name}: no init process under its anchor")
            host.init = kids[0].pid

    def close(self) -> list[int]:
        """Kill every process of every host and delete every namespace made. Returns the
        processes that were still running (beyond the anchors) when it was called."""
        left = []
        for host in self.hosts.values():
            if host.anchor is not None:
                left += host.pids()
        for ns in [f"{self.tag}-{n}" for n in self.names] + [self.switch]:
            _remove(ns)
        for host in self.hosts.values():
            if host.anchor is not None:
                try:
                    host.anchor.kill()
                    host.anchor.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        return left


# ---------------------------------------------------------------------- the services on the hosts

PY = sys.executable
RAGKIT = str(Path(PY).parent / "ragkit")
RAY_PORT, CLIENT_PORT, CHROMA_PORT, ENGINE_PORT = 6379, 10001, 8000, 8080
CHROMA_LOCAL_PORT = 8001  # `chroma run` on D's loopback; nginx on CHROMA_PORT checks the store token

# nginx in front of `chroma run` (which checks no token itself): requests without the bearer
# token are refused with 401 before they reach the store
NGINX_CONF = """worker_processes 1;
pid /tmp/nginx/nginx.pid;
error_log /tmp/nginx/error.log;
events {}
http {
    access_log /tmp/nginx/access.log;
    client_body_temp_path /tmp/nginx/body;
    proxy_temp_path /tmp/nginx/proxy;
    fastcgi_temp_path /tmp/nginx/fastcgi;
    uwsgi_temp_path /tmp/nginx/uwsgi;
    scgi_temp_path /tmp/nginx/scgi;
    client_max_body_size 0;
    server {
        listen %(address)s:%(port)d;
        location / {
            if ($http_authorization != "Bearer %(token)s") { return 401; }
            proxy_pass http://127.0.0.1:%(local)d;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 600s;
        }
    }
}
"""


class Net:
    def __init__(self, hosts: Hosts, strace: list[str] | None):
        self.hosts = hosts
        self.strace = strace
        self.token = secrets.token_hex(16)  # Ray's
        self.store_token = secrets.token_hex(16)  # the Chroma server's proxy
        self.procs: dict[str, object] = {}
        self.traces: list[tuple[Host, str]] = []  # (host, trace path inside it)

    def __getattr__(self, name):
        if len(name) == 1:
            return self.hosts[name]
        raise AttributeError(name)

    @property
    def network(self):
        return ipaddress.ip_network(self.hosts.network)

    @property
    def ray_env(self) -> dict:
        # Ray's token authentication: a node or driver without the token is refused
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_worker_niceness": "0"}

    def traced(self, host: Host, name: str, cmd: list[str]) -> list[str]:
        if not self.strace:
            return cmd
        path = f"/tmp/trace/{name}.strace"
        self.traces.append((host, path))
        return [*self.strace, "-o", path, *cmd]

    def start(self, host: Host, name: str, cmd: list[str], **env) -> None:
        self.procs[name] = host.popen(self.traced(host, name, cmd), f"/tmp/{name}.log", env=host.env(**env))

    def log(self, host: Host, name: str) -> str:
        p = host.path(f"/tmp/{name}.log")
        return p.read_text(errors="replace") if p.exists() else ""

    @property
    def client(self) -> str:
        return f"ray://{self.c.address}:{CLIENT_PORT}"

    @property
    def store_url(self) -> str:
        return f"http://{self.d.address}:{CHROMA_PORT}"

    def driver_env(self, host: Host, collection: str, **extra) -> dict:
        """A driver's environment: the cluster's token, the store on D, without ragkit's
        offline switches (ragkit must set them itself)."""
        from ragkit._offline import OFFLINE_ENV

        env = host.env(RAGKIT_STORE_URL=self.store_url, RAGKIT_STORE_TOKEN=self.store_token, RAGKIT_COLLECTION=collection,
                       **self.ray_env, **extra)
        return {k: v for k, v in env.items() if k not in OFFLINE_ENV}

    def ragkit(self, host: Host, name: str, args: list[str], env: dict, timeout: float = 400):
        return host.run(self.traced(host, name, [RAGKIT, *args]), env=env, timeout=timeout)


def wait_for(what: str, ok, timeout: float, why=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s: {why()[-3000:]}")


_READY = """
import json, sys, urllib.error, urllib.request
for url in sys.argv[1:]:
    try:
        urllib.request.urlopen(url, timeout=2).read()
    except urllib.error.HTTPError:
        pass  # it answers (the store's proxy: 401 without the token)
    except Exception as exc:
        print(json.dumps({"url": url, "error": str(exc)})); sys.exit(1)
"""

# the alive nodes, through the head's Ray Client server (tried 3 times, as ragkit's connect
# does: Ray's proxy fails to start a client's server now and then, docs/cluster.md)
_NODES = """
import json, ray
for attempt in range(3):
    try:
        ray.init(address=%r, logging_level="ERROR")
        break
    except ConnectionAbortedError:
        if attempt == 2:
            raise
print(json.dumps(sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])))
"""




def start_net(hosts: Hosts, strace: list[str] | None, engine_model: Path | None = None) -> Net:
    """The services of tests/test_hosts.py on started hosts: on D a `chroma run` server and
    (on its loopback) behind nginx, which asks for the store token, and (with `engine_model`)
    llama-cpp-python's OpenAI-compatible server; on C the Ray head with
    its Ray Client server; on B a Ray node joined to it; each under `strace` when given. Waits
    until A reaches D's services and sees both Ray nodes."""
    n = Net(hosts, strace)
    for h in hosts.hosts.values():
        h.path("/tmp/trace").mkdir()
    a, b, c, d = n.a, n.b, n.c, n.d
    n.start(d, "chroma", [str(Path(PY).parent / "chroma"), "run", "--path", "/tmp/chroma", "--host", "127.0.0.1",
                          "--port", str(CHROMA_LOCAL_PORT)], ANONYMIZED_TELEMETRY="False")
    conf = d.path("/tmp/nginx/nginx.conf")
    conf.parent.mkdir()
    conf.write_text(NGINX_CONF % {"address": d.address, "port": CHROMA_PORT, "token": n.store_token, "local": CHROMA_LOCAL_PORT})
    n.start(d, "nginx", ["nginx", "-c", "/tmp/nginx/nginx.conf", "-g", "daemon off;"])
    ready = [f"{n.store_url}/api/v2/heartbeat"]
    if engine_model is not None:
        # llama-cpp-python's OpenAI-compatible server (its app, settings from the environment),
        # served by uvicorn on asyncio's loop: on uvloop, libuv's io_uring would carry sockets no
        # strace sees (ragkit's own servers use asyncio's loop for that reason)
        n.start(d, "engine", [PY, "-m", "uvicorn", "--factory", "llama_cpp.server.app:create_app", "--loop", "asyncio",
                              "--host", d.address, "--port", str(ENGINE_PORT)],
                MODEL=str(engine_model), N_CTX="2048", N_THREADS="1", N_THREADS_BATCH="1", LOGITS_ALL="false")
        ready.append(f"http://{d.address}:{ENGINE_PORT}/v1/models")
    node = [PY, "-m", "ragkit.cluster.local", "node", "--block", "--num-cpus=1", "--temp-dir=/tmp/ray",
            "--disable-usage-stats", "--include-log-monitor=false"]
    n.start(c, "ray-head", node + ["--head", f"--node-ip-address={c.address}", f"--port={RAY_PORT}",
                                   "--include-dashboard=false", f"--ray-client-server-port={CLIENT_PORT}"], **n.ray_env)
    wait_for("the Ray head", lambda: "Ray runtime started" in n.log(c, "ray-head"), 120, lambda: n.log(c, "ray-head"))
    n.start(b, "ray-node", node + [f"--address={c.address}:{RAY_PORT}", f"--node-ip-address={b.address}"], **n.ray_env)
    wait_for("the Ray node on B", lambda: "Ray runtime started" in n.log(b, "ray-node"), 120, lambda: n.log(b, "ray-node"))
    wait_for("the services on D", lambda: a.run([PY, "-c", _READY, *ready], timeout=30).returncode == 0,
             120, lambda: n.log(d, "chroma") + n.log(d, "nginx") + n.log(d, "engine"))
    got = a.run([PY, "-c", _NODES % n.client], env=a.env(**n.ray_env), timeout=120)
    if got.returncode != 0 or json.loads(got.stdout.splitlines()[-1]) != sorted([b.address, c.address]):
        raise RuntimeError(f"A does not see the two Ray nodes: {got.stdout[-500:]} {got.stderr[-3000:]}")
    return n
