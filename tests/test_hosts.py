"""Ingest and batch evaluation across hosts that share no files, no loopback and no process
table (`make cluster-test`; needs root). tests/hosts.py makes four hosts on this machine:

- A: the driver (`ragkit ingest --cluster`, `ragkit eval run --cluster`), and the only host
  that holds the documents (in its own /tmp);
- B: a Ray worker node; C: the Ray head (and a worker node), with its Ray Client server;
- D: a `chroma run` server on its loopback behind nginx, which asks for the store's token
  (`store_token`: `chroma run` checks none), and an engine (llama-cpp-python's server).

The cluster uses Ray's token authentication (every process and the driver hold the token) and
every long-running process, and each driver run, is under `strace -f` from its start: the last
test reads every trace. A host's only way to another is the test network."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import time
from pathlib import Path

import hosts as hostlib
import psutil
import pytest
from conftest import CORPORA, in_ci, make_settings

pytestmark = pytest.mark.hosts

BAD = "broken-scan.pdf"
PY, RAGKIT, ENGINE_PORT = hostlib.PY, hostlib.RAGKIT, hostlib.ENGINE_PORT


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    from test_network import _strace_cmd
    from test_openai_backend import model_path

    why = hostlib.available()
    if why:
        if in_ci():
            pytest.fail(f"separate hosts cannot be made here ({why}): CI runs as root")
        pytest.skip(why)
    strace = _strace_cmd(tmp_path_factory.mktemp("probe") / "probe.strace")
    if strace is None and in_ci():
        pytest.fail("strace cannot trace here: the OS-level network check must run in CI")
    hosts = hostlib.Hosts().start()
    try:
        n = hostlib.start_net(hosts, strace[:-2] if strace else None, engine_model=model_path())
        yield n
    finally:
        left = hosts.close()
        assert not [ns for ns in hostlib.namespaces() if ns.startswith(hosts.tag)], "namespaces left behind"
        assert not [p for p in left if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def docs_on_a(net):
    """The sample NDAs and a file that cannot be read, in A's /tmp only."""
    d = net.a.path("/tmp/docs")
    shutil.copytree(CORPORA, d)
    (d / BAD).write_bytes(b"%PDF-1.4\n" + os.urandom(2048))
    for h in (net.b, net.c, net.d):
        assert not h.path("/tmp/docs").exists()
    return "/tmp/docs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same batch ingested locally, in one process on this machine's own namespace."""
    from test_cluster import snapshot

    from ragkit.ingest import ingest

    d = tmp_path_factory.mktemp("hosts-ref") / "docs"
    shutil.copytree(CORPORA, d)
    (d / BAD).write_bytes(b"%PDF-1.4\n" + os.urandom(2048))
    settings = make_settings(tmp_path_factory.mktemp("hosts-ref-store") / "s")
    report = ingest([d], settings, overlap=False)
    assert [Path(f["path"]).name for f in report.failed] == [BAD]
    return report, snapshot(settings)


_SNAPSHOT = """
import json, sys
from pathlib import Path
from ragkit.config import load_settings
from ragkit.embed import load_embedder
from ragkit.store import open_store
settings = load_settings(store=Path("/tmp/unused"), store_url=sys.argv[1], collection=sys.argv[2], store_token=sys.argv[3])
st = open_store(settings, load_embedder(settings), create=False)
got = st.col.get(include=["metadatas", "embeddings", "documents"])
print(json.dumps({
    "docs": sorted([r.name, r.doc_id, r.sha256, r.n_chunks, r.n_sections, r.n_pages] for r in st.documents()),
    "ids": list(got["ids"]), "texts": list(got["documents"]), "metas": list(got["metadatas"]),
    "vectors": [list(map(float, e)) for e in got["embeddings"]]}))
"""


def assert_store_on_d_equals(net: hostlib.Net, collection: str, ref: dict) -> None:
    """The collection on D, read from A, against the local reference: same records, chunk ids,
    texts, metadata, each chunk once; vectors within cosine 1e-3."""
    import numpy as np
    from test_cluster import assert_same_store

    got = net.a.run([PY, "-c", _SNAPSHOT, net.store_url, collection, net.store_token], env=net.a.env(), timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    s = json.loads(got.stdout.splitlines()[-1])
    snap = {"docs": [tuple(x) for x in s["docs"]], "chunk_ids": sorted(s["ids"]), "duplicates": len(s["ids"]) - len(set(s["ids"])),
            "texts": dict(zip(s["ids"], s["texts"])), "metas": dict(zip(s["ids"], s["metas"])),
            "vectors": {i: np.asarray(v, dtype=np.float32) for i, v in zip(s["ids"], s["vectors"])}}
    assert_same_store(snap, ref)


def test_a_document_only_on_host_a_is_parsed_and_embedded_on_b_and_c_and_lands_once_in_d(net, docs_on_a, reference):
    ref_report, ref = reference
    env = net.driver_env(net.a, "hosts")
    res = net.ragkit(net.a, "ingest", ["ingest", docs_on_a, "--cluster", net.client, "--json"], env)
    assert res.returncode == 1, res.stderr[-3000:]  # the broken file, by name; the batch went on
    got = json.loads(res.stdout)
    assert [Path(f["path"]).name for f in got["failed"]] == [BAD] and got["added"] == ref_report.added, got["failed"]
    # bytes travelled: both worker hosts parsed and embedded what only A holds
    assert set(got["nodes"]) == {net.b.address, net.c.address}, got["nodes"]
    assert all(w["parsed"] >= 1 and w["embedded"] >= 1 for w in got["nodes"].values()), got["nodes"]
    assert sum(w["parsed"] for w in got["nodes"].values()) == ref_report.added + 1  # the broken file too
    assert sum(w["embedded"] for w in got["nodes"].values()) == got["chunks_embedded"] == ref_report.chunks_embedded
    assert_store_on_d_equals(net, "hosts", ref)

    # the store answers no one without its token (its proxy refuses; `chroma run` itself listens on D's loopback only)
    env.pop("RAGKIT_STORE_TOKEN")
    res = net.ragkit(net.a, "docs-without-token", ["docs", "--json"], env)
    said = json.loads(res.stdout)
    assert res.returncode == 4 and "401" in said["error"] and "set store_token" in said["error"], said


def test_the_evaluation_is_answered_on_b_and_c_through_the_engine_on_d_and_comes_back_to_a(net, docs_on_a):
    from conftest import ROOT

    env = net.driver_env(net.a, "hosts", RAGKIT_GENERATOR__BACKEND="openai",
                         RAGKIT_GENERATOR__BASE_URL=f"http://{net.d.address}:{ENGINE_PORT}/v1",
                         RAGKIT_GENERATOR__MAX_TOKENS="32", RAGKIT_GENERATOR__N_CTX="2048", RAGKIT_RETRIEVE__TOP_K="2")
    set_path = str(ROOT / "eval" / "sets" / "nda-demo.jsonl")
    before = net.log(net.d, "engine").count('"POST /v1/')  # uvicorn's access lines
    res = net.ragkit(net.a, "eval", ["eval", "run", set_path, "--limit", "2", "--out", "/tmp/run", "--cluster", net.client,
                                     "--json"], env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(x) for x in net.a.path("/tmp/run/answers.jsonl").read_text().splitlines() if x.strip()]
    assert len(records) == 2 and len({r["id"] for r in records}) == 2
    assert all(r["status"] == "ok" and r["answer"] for r in records), records
    assert json.loads(res.stdout)["metrics"]
    # the engine was asked by the answering actors on B and C, never by the driver on A
    asked = [ln for ln in net.log(net.d, "engine").splitlines() if '"POST /v1/' in ln][before:]
    callers = {_caller(ln) for ln in asked}
    assert asked and callers <= {net.b.address, net.c.address}, asked


def _caller(line: str) -> str:
    """The client address of a uvicorn access line: `INFO:     10.213.1.3:40112 - "POST /v1/..."`."""
    for word in line.split():
        host, sep, port = word.rpartition(":")
        if sep and port.isdigit():
            try:
                ipaddress.ip_address(host)
                return host
            except ValueError:
                continue
    return "?"


_LEASE_HOLDER = """
import json, sys, chromadb
from chromadb.config import Settings
host, port = sys.argv[1].rsplit("//", 1)[1].split(":")
client = chromadb.HttpClient(host=host, port=int(port), headers={"Authorization": "Bearer " + sys.argv[3]},
                             settings=Settings(anonymized_telemetry=False))
try:
    got = client.get_collection(sys.argv[2] + "-lock").get(ids=["writer"], include=["metadatas"])
except Exception:
    print("null"); sys.exit(0)
print(json.dumps((got["metadatas"] or [None])[0]))
"""


def test_a_second_driver_on_another_host_is_refused_by_the_store_lease(net, docs_on_a):
    env = net.driver_env(net.a, "hosts-lease")
    first = net.a.popen(net.traced(net.a, "ingest-lease", [RAGKIT, "ingest", docs_on_a, "--cluster", net.client, "--json"]),
                        "/tmp/lease-first.log", env=env)
    try:
        def held() -> bool:
            out = net.c.run([PY, "-c", _LEASE_HOLDER, net.store_url, "hosts-lease", net.store_token], env=net.c.env(), timeout=60)
            return out.returncode == 0 and out.stdout.strip() not in ("", "null")

        hostlib.wait_for("A's lease on the store", held, 180, lambda: net.log(net.a, "lease-first"))
        mine = net.c.path("/tmp/mine")
        mine.mkdir()
        shutil.copy(CORPORA / "ai-osi-stack-mutual-nda.md", mine)
        res = net.ragkit(net.c, "second-driver", ["ingest", "/tmp/mine", "--json"], net.driver_env(net.c, "hosts-lease"))
        assert res.returncode == 5, res.stderr[-3000:] + res.stdout[-3000:]
        assert "Traceback" not in res.stderr + res.stdout
        said = json.loads(res.stdout)  # --json: the error is the JSON answer
        assert said["exit_code"] == 5 and "another ragkit process (host host-a, pid" in said["error"], said
        assert "'hosts-lease'" in said["error"], said
        assert first.wait(300) == 1, net.log(net.a, "lease-first")[-3000:]  # the broken file only
    finally:
        if first.poll() is None:
            first.kill()


def test_host_b_powered_off_mid_ingest_loses_and_duplicates_nothing(net, docs_on_a, reference):
    """Every process of host B killed (its link first: the others hear nothing) while it parses
    a file for A: Ray re-runs the parse and restarts B's embedder on C; the run completes and
    the store equals the local reference."""
    ref_report, ref = reference
    env = net.driver_env(net.a, "hosts-poweroff")
    proc = net.a.popen(net.traced(net.a, "ingest-poweroff", [RAGKIT, "ingest", docs_on_a, "--cluster", net.client, "--json"]),
                       "/tmp/poweroff.log", env=env)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not killed and proc.poll() is None and time.monotonic() < deadline:
            for pid in net.b.pids():
                try:
                    title = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                if title.startswith(("ray::_parse_sent", "ray::_EmbedActor.embed")):
                    killed = net.b.power_off()
                    break
            time.sleep(0.05)
        assert killed, "B never worked for A's ingest: " + net.log(net.a, "poweroff")[-2000:]
        assert proc.wait(400) == 1, net.log(net.a, "poweroff")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = net.log(net.a, "poweroff")
    got = json.loads(out[out.index("{"):])
    assert [Path(f["path"]).name for f in got["failed"]] == [BAD] and got["added"] == ref_report.added, got["failed"]
    assert got["nodes"].get(net.c.address, {}).get("parsed", 0) >= 1
    assert_store_on_d_equals(net, "hosts-poweroff", ref)


def _ns_pid(pid: int) -> str | None:
    """A process's id inside its host's PID namespace (what strace there writes)."""
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("NSpid:"):
                return ln.split()[-1]
    except OSError:
        return None
    return None


def test_no_process_on_any_host_reaches_beyond_the_test_network(net):
    """Every process that ran on any host (Ray's on B and C since they started, Chroma and the
    engine on D, each driver on A and the second driver on C) was under `strace -f`: every
    connect and send is to the test network, loopback or AF_UNIX, and no name is looked up.
    Every live process of every host is in a trace; every listening socket is on the host's
    own address, loopback or the wildcard of a namespace that has only those two; and this
    machine's own namespace holds no address of the test network."""
    from test_network import offending_lines

    if not net.strace:
        pytest.skip("strace is not installed or cannot trace here")
    traces: dict[str, str] = {}
    for host, path in net.traces:
        p = host.path(path)
        assert p.exists(), f"{host.name}: {path} was not written"
        traces[f"{host.name}:{path}"] = p.read_text(errors="replace")
    for name, trace in traces.items():
        assert offending_lines(trace, net.network) == [], name
    reached = {name for name, t in traces.items() if f'inet_addr("{net.hosts.subnet}.' in t}
    assert {"c:/tmp/trace/ray-head.strace", "b:/tmp/trace/ray-node.strace", "a:/tmp/trace/ingest.strace"} <= reached, reached

    for host in net.hosts.hosts.values():
        traced = {ln.split()[0] for k, t in traces.items() if k.startswith(f"{host.name}:") for ln in t.splitlines() if ln.split()}
        tracers = set()
        for pid in host.pids():
            try:
                if psutil.Process(pid).name() in ("strace", "nsenter"):
                    tracers.add(pid)
            except psutil.Error:
                pass
        live = {_ns_pid(p): p for p in host.pids() if p not in tracers}
        live = {k: v for k, v in live.items() if k is not None}
        assert set(live) <= traced, (host.name, {k: psutil.Process(v).name() for k, v in live.items() if k not in traced})
        assert set(host.interfaces()) == {"lo", "eth0"} and host.interfaces()["eth0"] == [f"{host.address}/24"]
        for addr, port, who in host.listening():
            assert addr in (host.address, "127.0.0.1", "0.0.0.0", "*"), (host.name, addr, port, who)
    import subprocess

    mine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert f" {net.hosts.subnet}." not in mine
