"""Nothing leaves the machine, checked by the kernel's view rather than Python's.

The suite-wide guard (conftest.py) replaces Python's `socket.connect`; native code
(onnxruntime, Chroma's Rust core, llama.cpp) and child processes do not go through it.
Here the real CLI (ingest, ask with one generation, eval run) runs under `strace -f`,
which records every connect / sendto / sendmsg / sendmmsg of the process, all its
threads (native ones included) and its children; every socket address in the trace
must be loopback (127.0.0.0/8, ::1), AF_UNIX or AF_NETLINK. A DNS query is a leak even
to a resolver on loopback (port 53), and so is a name-service daemon that answers
(nscd, systemd-resolved): it would resolve a host where the trace cannot see.

The child processes get an environment without ragkit's offline switches, so ragkit
must set them itself. onnxruntime is known to look up a telemetry host about 30 s into
a process that made an InferenceSession unless ORT_DISABLE_TELEMETRY=1. These commands
do not load onnxruntime at all (Chroma is always given explicit embeddings), and each
may end before 30 s, so a late phone-home of that kind would be caught only by a traced
command that loads it and lives longer.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CORPORA, ROOT, in_ci

from ragkit._offline import OFFLINE_ENV

STRACE = shutil.which("strace")
# io_uring could connect without a connect syscall: it is traced so that it is seen at all
TRACED = "connect,sendto,sendmsg,sendmmsg,io_uring_setup,execve"
_EXE = Path(sys.executable).parent / "ragkit"
RAGKIT = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "ragkit.cli"]
DOCS = ["bonterms-mutual-nda-v1.pdf", "ai-osi-stack-mutual-nda.md"]

# ---------------------------------------------------------------------- the parser

_CALL = re.compile(r"^(?:\[pid\s+)?(?P<pid>\d+)\]?\s+(?P<call>connect|sendto|sendmsg|sendmmsg|io_uring_setup)\((?P<args>.*)$")
_RESUMED = re.compile(r"^(?:\[pid\s+)?(?P<pid>\d+)\]?\s+<\.\.\. (?P<call>\w+) resumed>.*\)\s+=\s+(?P<ret>-?\d+)")
_RET = re.compile(r"\)\s+=\s+(?P<ret>-?\d+)(?: [A-Z]\w*.*)?$")
_SOCKADDR = re.compile(r"\{sa_family=(?P<family>\w+)(?P<body>[^{}]*)\}")
_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
_INET = re.compile(r'inet_addr\("([^"]+)"\)')
_INET6 = re.compile(r'inet_pton\(AF_INET6,\s*"([^"]+)"')
_UNIX = re.compile(r'sun_path=(@?"[^"]*")')
# Local name-service daemons: what a process asks them cannot be read from the trace,
# and they resolve host names in their own process. A connect that fails (no daemon:
# glibc then resolves in-process, where the trace sees it) is fine; one that succeeds
# is flagged. nscd also serves passwd lookups (Python's getpwuid at import time tries it).
_NAME_SERVICES = ("nscd/socket", "io.systemd.Resolve")


def _ip_is_loopback(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _check_sockaddr(family: str, body: str, network=None) -> tuple[str | None, str | None]:
    """(why this socket address is not allowed, why it is not allowed if the call succeeds).
    `network` (an ipaddress network): addresses in it are allowed beside loopback (the test
    network of tests/test_hosts.py)."""
    if family in ("AF_NETLINK", "AF_UNSPEC"):  # kernel messages; AF_UNSPEC dissolves a UDP association
        return None, None
    if family == "AF_UNIX":
        path = _UNIX.search(body)
        if path and any(s in path.group(1) for s in _NAME_SERVICES):
            return None, f"name service {path.group(1)} answered (its lookups are not in the trace)"
        return None, None
    if family in ("AF_INET", "AF_INET6"):
        addr = (_INET if family == "AF_INET" else _INET6).search(body)
        port = _PORT.search(body)
        if not addr or not port:
            return f"unparsed {family} address", None
        where = f"{addr.group(1)} port {port.group(1)}"
        if network is not None and _in_network(addr.group(1), network):
            if port.group(1) == "53":
                return f"name lookup at {where}", None
            return None, None
        if not _ip_is_loopback(addr.group(1)):
            return f"non-loopback {where}", None
        if port.group(1) == "53":
            return f"name lookup through the local resolver at {where}", None
        return None, None
    return f"socket family {family}", None


def _in_network(text: str, network) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.version == network.version and ip in network


def join_unfinished(trace: str) -> str:
    """One line per call: strace -f splits a call that another thread interrupts into
    "PID call(args <unfinished ...>" and "PID <... call resumed>rest"; joined here, so
    that a send on a connected socket (asyncio's self-pipe: `sendto(fd, "\\0", 1, 0, NULL,
    0`) is read whole instead of as an address strace could not read."""
    out: list[str | None] = []
    pending: dict[str, int] = {}
    for line in trace.splitlines():
        m = re.match(r"^(\d+)\s+(.*) <unfinished \.\.\.>$", line)
        if m:
            pending[m.group(1)] = len(out)
            out.append(line[: -len(" <unfinished ...>")])
            continue
        r = re.match(r"^(\d+)\s+<\.\.\. \w+ resumed>(.*)$", line)
        if r and r.group(1) in pending:
            i = pending.pop(r.group(1))
            out[i] = out[i] + r.group(2)
            continue
        out.append(line)
    return "\n".join(x for x in out if x is not None)


def offending_lines(trace: str, network=None) -> list[tuple[str, str]]:
    """(line, why) for every traced call in an `strace -f` log that reaches anything but
    loopback, AF_UNIX or AF_NETLINK (or an address of `network`, an ipaddress network, when
    given). Fails closed: an address it cannot read is flagged."""
    bad = []
    pending: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (pid, call) -> flagged if it succeeds
    for line in trace.splitlines():
        line = line.rstrip()
        r = _RESUMED.match(line.strip())
        if r:
            for first, why in pending.pop((r.group("pid"), r.group("call")), []):
                if int(r.group("ret")) >= 0:
                    bad.append((first, why))
            continue
        m = _CALL.match(line.strip())
        if not m:  # other syscalls, "+++ exited", signals
            continue
        call, args = m.group("call"), m.group("args")
        if call == "io_uring_setup":
            bad.append((line, "io_uring (its connects are not syscalls strace sees)"))
            continue
        addrs = list(_SOCKADDR.finditer(args))
        ret = _RET.search(args)
        for a in addrs:
            why, why_if_ok = _check_sockaddr(a.group("family"), a.group("body"), network)
            if why:
                bad.append((line, why))
            elif why_if_ok:
                if ret is None:  # <unfinished ...>: the result is on the resumed line
                    pending.setdefault((m.group("pid"), call), []).append((line, why_if_ok))
                elif int(ret.group("ret")) >= 0:
                    bad.append((line, why_if_ok))
        if addrs:
            continue
        no_address = {
            "connect": False,
            # sendto on a connected socket; its ")" is on the resumed line when another
            # thread interrupted the call ("NULL, 0 <unfinished ...>")
            "sendto": bool(re.search(r",\s*NULL,\s*0(\)|\s*<unfinished \.\.\.>)", args)),
            "sendmsg": "msg_name=" not in args or "msg_name=NULL" in args,
            "sendmmsg": not re.search(r"msg_name=(?!NULL)", args),
        }[call]
        if not no_address:
            bad.append((line, "an address strace could not read"))
    return bad


def test_the_parser_flags_what_leaves_the_machine_and_nothing_else():
    remote = [
        '4242  connect(3, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("140.82.112.3")}, 16) = 0',
        '4242  connect(7, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "2606:4700::6810:84e5", &sin6_addr), sin6_scope_id=0}, 28 <unfinished ...>',
        '[pid  4243] connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "::ffff:140.82.112.3", &sin6_addr), sin6_scope_id=0}, 28) = -1 ENETUNREACH (Network is unreachable)',
        '4244  sendto(9, "\\27\\3\\3"..., 517, MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(4318), '
        'sin_addr=inet_addr("10.1.2.3")}, 16) = 517',
        '4245  sendmsg(4, {msg_name={sa_family=AF_INET, sin_port=htons(123), sin_addr=inet_addr("192.0.2.9")}, '
        'msg_namelen=16, msg_iov=[{iov_base="x", iov_len=1}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 1',
        # name lookups, even through a resolver on this machine
        '4246  connect(3, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.53")}, 16) = 0',
        '4246  connect(4, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = 0',
        '4250  connect(4, {sa_family=AF_UNIX, sun_path="/run/systemd/resolve/io.systemd.Resolve"}, 42 <unfinished ...>',
        '4247  connect(3, {sa_family=AF_PACKET, sll_protocol=htons(ETH_P_ALL), sll_ifindex=2}, 20) = 0',
        '4248  connect(3, 0x7ffd12345678, 16) = -1 EFAULT (Bad address)',
        '4249  io_uring_setup(8, {flags=0, sq_thread_cpu=0}) = 3',
    ]
    local = [
        '4242  connect(3, {sa_family=AF_INET, sin_port=htons(8000), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        '4242  connect(3, {sa_family=AF_INET, sin_port=htons(8000), sin_addr=inet_addr("127.3.2.1")}, 16) = 0',
        '4242  connect(4, {sa_family=AF_INET6, sin6_port=htons(8000), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0',
        '4242  connect(5, {sa_family=AF_UNIX, sun_path="/tmp/x.sock"}, 110) = 0',
        '4242  sendto(6, [{nlmsg_len=20, nlmsg_type=RTM_GETADDR, nlmsg_flags=NLM_F_REQUEST|NLM_F_DUMP, nlmsg_seq=1, '
        'nlmsg_pid=0}, {ifa_family=AF_UNSPEC}], 20, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 20',
        '4242  sendto(3, "GET / HTTP/1.1\\r\\n"..., 120, 0, NULL, 0) = 120',
        '4242  sendmsg(3, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="x", iov_len=1}], msg_iovlen=1, '
        'msg_controllen=0, msg_flags=0}, MSG_NOSIGNAL) = 1',
        '4242  connect(3, {sa_family=AF_UNSPEC, sa_data="\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0"}, 16) = 0',
        '4250  <... connect resumed>)            = 0',
        # no name-service daemon: glibc resolves in-process, where the trace sees it
        '4242  connect(12, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)',
        '4251  connect(12, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110 <unfinished ...>',
        '4251  <... connect resumed>)            = -1 ECONNREFUSED (Connection refused)',
        # a send on a connected socket that another thread interrupted (asyncio's self-pipe)
        '4260  sendto(20, "\\0", 1, 0, NULL, 0 <unfinished ...>',
        '4260  <... sendto resumed>)            = 1',
        '4242  execve("/usr/bin/python3", ["python3"], 0x7ffd1f0 /* 3 vars */) = 0',
        '4242  +++ exited with 0 +++',
    ]
    flagged = offending_lines("\n".join(remote + local))
    assert sorted(line for line, _ in flagged) == sorted(remote)
    whys = dict((line, why) for line, why in flagged)
    assert whys[remote[0]] == "non-loopback 140.82.112.3 port 443"
    assert "2606:4700::6810:84e5" in whys[remote[1]] and "::ffff:140.82.112.3" in whys[remote[2]]
    assert whys[remote[5]].startswith("name lookup") and whys[remote[6]].startswith("name service")
    assert whys[remote[7]].startswith("name service")  # its result came on the resumed line
    assert offending_lines("\n".join(local)) == []
    # the test network of tests/test_hosts.py: its addresses pass, a lookup there or an address
    # beside it does not
    net = ipaddress.ip_network("10.1.2.0/24")
    lookup = '4246  connect(3, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.1.2.9")}, 16) = 0'
    beside = '4246  connect(3, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("10.1.3.3")}, 16) = 0'
    assert sorted(line for line, _ in offending_lines("\n".join(remote + local + [lookup, beside]), net)) == sorted(
        line for line in remote + [lookup, beside] if line != remote[3])


# ---------------------------------------------------------------------- tracing

def _strace_cmd(log: Path) -> list[str] | None:
    """The strace command line, or None when strace cannot trace here (not installed, or
    ptrace not permitted). --seccomp-bpf stops the tracee only on the traced syscalls."""
    if STRACE is None:
        return None
    for extra in (["--seccomp-bpf"], []):
        cmd = [STRACE, "-f", *extra, "-s", "64", "-e", f"trace={TRACED}", "-o", str(log)]
        if subprocess.run([*cmd, "true"], capture_output=True, timeout=60).returncode == 0:
            return cmd
    return None


@pytest.fixture(scope="module")
def strace(tmp_path_factory):
    probe = tmp_path_factory.mktemp("probe") / "probe.log"
    cmd = _strace_cmd(probe)
    if cmd is None:
        why = "strace is not installed (apt-get install strace)" if STRACE is None else "strace cannot trace here (ptrace not permitted)"
        if in_ci():
            pytest.fail(f"{why}: the OS-level network check must run in CI (.ci/run installs strace)")
        pytest.skip(why)
    return cmd[:-2]  # without "-o probe.log"


def _env() -> dict:
    """The caller's environment without ragkit's offline switches (ragkit must set them
    itself), with a small context and answer so one generation stays short."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV}
    env.update({"RAGKIT_GENERATOR__N_CTX": "1024", "RAGKIT_GENERATOR__MAX_TOKENS": "16", "PYTHONUNBUFFERED": "1"})
    return env


def traced(strace: list[str], log: Path, argv: list[str], timeout: int = 900) -> tuple[subprocess.CompletedProcess, str, float]:
    t0 = time.monotonic()
    res = subprocess.run([*strace, "-o", str(log), *argv], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    return res, log.read_text(errors="replace"), time.monotonic() - t0


def assert_traced_whole_process(trace: str, argv0: str) -> None:
    """The trace is of this process (its execve succeeded), it ran to the end (the top
    process exited), and it covers more than one task (threads and children followed)."""
    lines = trace.splitlines()
    assert lines, "empty trace"
    first = lines[0]
    top = first.split()[0]
    assert re.match(rf'^{top}\s+execve\("{re.escape(argv0)}", .* = 0$', first), first
    assert any(re.match(rf"^{top}\s+\+\+\+ exited with 0 \+\+\+$", ln) for ln in lines), "the top process's exit is not in the trace"
    tasks = {ln.split()[0] for ln in lines if ln.split() and ln.split()[0].isdigit()}
    assert len(tasks) >= 2, f"only {tasks} traced: threads were not followed"


def test_strace_catches_a_connect_from_a_thread_of_a_grandchild(strace, tmp_path):
    """The same tracing as below sees a connect made by a thread of a grandchild process
    (a UDP connect to a TEST-NET address: no packet is sent)."""
    inner = ("import socket, threading\n"
             "def f():\n"
             "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             "    try: s.connect(('192.0.2.1', 443))\n"
             "    except OSError: pass\n"
             "t = threading.Thread(target=f); t.start(); t.join()\n")
    outer = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {inner!r}], check=True)"
    res, trace, _ = traced(strace, tmp_path / "control.log", [sys.executable, "-c", outer], timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_traced_whole_process(trace, sys.executable)
    flagged = offending_lines(trace)
    assert [why for _, why in flagged] == ["non-loopback 192.0.2.1 port 443"], flagged
    top = trace.splitlines()[0].split()[0]
    assert flagged[0][0].split()[0] != top  # seen in another task than the one strace started


@pytest.fixture(scope="module")
def traced_ingest(strace, tmp_path_factory):
    base = tmp_path_factory.mktemp("net")
    corpus = base / "docs"
    corpus.mkdir()
    for name in DOCS:
        shutil.copy(CORPORA / name, corpus / name)
    store = base / "store"
    argv = [*RAGKIT, "ingest", str(corpus), "--store", str(store), "--json"]
    res, trace, took = traced(strace, base / "ingest.log", argv)
    print(f"traced ingest: {took:.1f}s")
    return {"res": res, "trace": trace, "argv": argv, "store": store, "base": base}


@pytest.mark.complete
def test_ingest_reaches_nothing_but_loopback(traced_ingest):
    res, trace = traced_ingest["res"], traced_ingest["trace"]
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["added"] == len(DOCS)
    assert_traced_whole_process(trace, traced_ingest["argv"][0])
    assert offending_lines(trace) == []


def test_ask_with_one_generation_reaches_nothing_but_loopback(strace, traced_ingest, tmp_path):
    assert traced_ingest["res"].returncode == 0, "ingest failed"
    argv = [*RAGKIT, "ask", "Which law governs this agreement?", "--doc", DOCS[0],
            "--store", str(traced_ingest["store"]), "--json"]
    res, trace, took = traced(strace, tmp_path / "ask.log", argv)
    print(f"traced ask: {took:.1f}s")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["usage"]["completion_tokens"] > 0 and out["answer"].strip()  # a real generation ran
    assert_traced_whole_process(trace, argv[0])
    assert offending_lines(trace) == []


@pytest.mark.complete
def test_eval_run_reaches_nothing_but_loopback(strace, traced_ingest, tmp_path):
    assert traced_ingest["res"].returncode == 0, "ingest failed"
    items = [json.loads(x) for x in (ROOT / "eval" / "sets" / "nda-demo.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    items = [i for i in items if i.get("doc") in DOCS][:2]
    assert len(items) == 2
    set_path = tmp_path / "set.jsonl"
    set_path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    run = tmp_path / "run"
    argv = [*RAGKIT, "eval", "run", str(set_path), "--store", str(traced_ingest["store"]), "--out", str(run), "--json"]
    res, trace, took = traced(strace, tmp_path / "eval.log", argv)
    print(f"traced eval run: {took:.1f}s")
    assert res.returncode == 0, res.stderr[-3000:]
    answers = [json.loads(x) for x in (run / "answers.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    assert sorted(a["id"] for a in answers) == sorted(i["id"] for i in items)
    assert all(a["status"] == "ok" for a in answers), answers
    assert any(a["completion_tokens"] > 0 for a in answers)  # the generator ran in this process
    assert_traced_whole_process(trace, argv[0])
    assert offending_lines(trace) == []
