"""`ingest --cluster`: the sample NDAs through a real two-node Ray cluster on loopback (two
raylets, so tasks and actors cross node boundaries), against a local single-process ingest.
The cluster is started by the session fixture and stopped (its process groups killed) at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import CORPORA, ROOT, make_settings
from test_chroma_server import chroma_server  # noqa: F401  (the `chroma run` server fixture)
from test_ocr import needs_tesseract

BAD = "broken-scan.pdf"


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    from test_network import _strace_cmd

    from ragkit.cluster import local

    temp = Path(f"/tmp/rk-ray-{os.getpid()}")  # Ray's socket paths must stay short (AF_UNIX: 107 bytes)
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    # every process of the cluster, from its start, under strace -f (the last test reads the
    # traces); without strace the cluster runs untraced and that test skips (fails in CI)
    strace = _strace_cmd(temp / "probe.strace")
    traces = [temp / f"node{i}.strace" for i in range(2)]
    wrap = (lambda i: [*strace[:-2], "-o", str(traces[i])]) if strace else None
    cluster = local.start(temp, nodes=2, cpus_per_node=1, wrap=wrap)
    cluster.traces = traces if strace else []
    yield cluster
    procs = cluster.processes()
    cluster.stop(grace_s=5)
    shutil.rmtree(temp, ignore_errors=True)
    left = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"cluster processes left running: {left}"


def _cluster_procs(cluster) -> list[psutil.Process]:
    return cluster.processes()


def _ragkit_cmd() -> list[str]:
    """The installed `ragkit` command of this interpreter's environment (or `python -m ragkit.cli`)."""
    exe = Path(sys.executable).parent / "ragkit"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ragkit.cli"]


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    """The NDAs plus one file that cannot be read."""
    d = tmp_path_factory.mktemp("cluster-batch") / "nda"
    shutil.copytree(CORPORA, d)
    for p in d.iterdir():
        p.chmod(0o644)
    (d / BAD).write_bytes(b"%PDF-1.4\n" + os.urandom(2048))
    return d


@pytest.fixture(scope="module")
def reference(tmp_path_factory, batch):
    """A local single-process ingest of the same batch."""
    from ragkit.ingest import ingest

    settings = make_settings(tmp_path_factory.mktemp("cluster-ref") / "s")
    report = ingest([batch], settings, overlap=False)
    assert [Path(f["path"]).name for f in report.failed] == [BAD]
    return settings, report, snapshot(settings)


def snapshot(settings) -> dict:
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    st = open_store(settings, load_embedder(settings), create=False)
    got = st.col.get(include=["metadatas", "embeddings", "documents"])
    ids = list(got["ids"])
    return {
        "docs": sorted((r.name, r.doc_id, r.sha256, r.n_chunks, r.n_sections, r.n_pages) for r in st.documents()),
        "chunk_ids": sorted(ids),
        "duplicates": len(ids) - len(set(ids)),
        "texts": dict(zip(ids, got["documents"])),
        "metas": {i: {k: v for k, v in m.items()} for i, m in zip(ids, got["metadatas"])},
        "vectors": {i: np.asarray(e, dtype=np.float32) for i, e in zip(ids, got["embeddings"])},
    }


def assert_same_store(snap: dict, ref: dict) -> None:
    assert snap["docs"] == ref["docs"]
    assert snap["chunk_ids"] == ref["chunk_ids"] and snap["duplicates"] == 0
    assert snap["texts"] == ref["texts"]
    assert snap["metas"] == ref["metas"]  # text_hash included: the embed cache's keys
    worst = min(float(np.dot(snap["vectors"][i], ref["vectors"][i]) /
                      (np.linalg.norm(snap["vectors"][i]) * np.linalg.norm(ref["vectors"][i]))) for i in ref["chunk_ids"])
    assert worst >= 1 - 1e-3, worst


def test_cluster_ingest_equals_a_local_ingest_and_stays_on_loopback(ray_cluster, batch, reference, tmp_path,
                                                                     no_outbound_network):
    from ragkit.cluster import ingest_on_cluster

    _, ref_report, ref = reference
    settings = make_settings(tmp_path / "s")
    before = len(no_outbound_network)
    events: list[tuple[str, dict]] = []
    report = ingest_on_cluster([batch], settings, ray_cluster.address, on_event=lambda k, i: events.append((k, i)))

    # the bad file is reported by name, the batch went on
    assert [(Path(f["path"]).name, f["error"]) for f in report.failed] == [(Path(f["path"]).name, f["error"])
                                                                            for f in ref_report.failed]
    assert report.to_json()["added"] == ref_report.added == len(list(CORPORA.iterdir()))
    assert (report.chunks, report.chunks_embedded, report.chunks_from_cache) == (
        ref_report.chunks, ref_report.chunks_embedded, ref_report.chunks_from_cache)
    assert report.timings["cluster_nodes"] == 2 and report.timings["embed_actors"] == 2
    assert_same_store(snapshot(settings), ref)
    # commits in file order, each after its parse (progress events as the local ingest's)
    files = [i["path"] for k, i in events if k == "file"]
    assert files == [f["path"] for f in ref_report.files]
    assert sum(i["n"] for k, i in events if k == "embedded") == report.chunks_embedded

    # unchanged files: nothing parsed, no actor started
    again = ingest_on_cluster([batch], settings, ray_cluster.address)
    assert (again.added, again.unchanged, again.chunks, again.timings["embed_actors"]) == (0, 7, 0, 0)

    # the driver connected to loopback only; every cluster process listens on loopback only
    for family, address in no_outbound_network[before:]:
        if isinstance(address, tuple):
            assert address[0] in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "localhost"), address
    listening = []
    for p in _cluster_procs(ray_cluster):
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        listening += [(p.name(), c.laddr.ip) for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, ip in listening), listening


@pytest.fixture(scope="module")
def slow_batch(tmp_path_factory):
    """Two NDAs and a scanned page (tesseract reads it: a parse of several seconds, long
    enough to kill its worker mid-task), with a local single-process ingest of them."""
    from test_ocr import make_scan

    from ragkit.ingest import ingest

    d = tmp_path_factory.mktemp("cluster-slow") / "docs"
    d.mkdir()
    for name in ("ai-osi-stack-mutual-nda.md", "cnli_dev_054.docx"):
        shutil.copy(CORPORA / name, d / name)
    make_scan(CORPORA / "cnli_dev_019.pdf", d / "scanned-nda.pdf")
    settings = make_settings(tmp_path_factory.mktemp("cluster-slow-ref") / "s")
    report = ingest([d], settings, overlap=False)
    assert report.failed == [] and report.added == 3
    return d, report, snapshot(settings)


# in neither tier: CI kills a whole host mid-ingest instead (tests/test_hosts.py::
# test_host_b_powered_off_mid_ingest_loses_and_duplicates_nothing: the parse re-run, the embedder restarted)
@pytest.mark.slow
@needs_tesseract  # slow_batch's scanned page is read by tesseract (skips without it, as tests/test_ocr.py)
def test_parse_worker_and_embedders_killed_mid_ingest_lose_and_duplicate_nothing(ray_cluster, slow_batch, tmp_path):
    """kill -9 a parse task's worker two seconds into its parse (the scanned page's OCR), and
    the embedder actors after the first commit: Ray re-runs the parse and restarts the actors
    (their batches re-sent); the store ends as the local ingest's, each chunk once."""
    import threading

    from ragkit.cluster import ingest_on_cluster

    docs, ref_report, ref = slow_batch
    settings = make_settings(tmp_path / "s")
    killed: list[str] = []
    nices: list[int] = []  # the embedder actors' nice values, read before they are killed
    stop = threading.Event()

    def hunt_parser() -> None:
        first_seen: dict[int, float] = {}
        while not stop.is_set():
            for p in ray_cluster.processes():
                try:
                    busy = " ".join(p.cmdline()).startswith("ray::_parse_sent")
                except psutil.Error:
                    continue
                if not busy:
                    first_seen.pop(p.pid, None)
                elif time.monotonic() - first_seen.setdefault(p.pid, time.monotonic()) > 2.0:
                    p.kill()
                    killed.append("ray::_parse_sent")
                    return
            time.sleep(0.1)

    def on_event(kind: str, info: dict) -> None:
        if kind == "file" and "ray::_EmbedActor" not in killed:
            for p in _cluster_procs(ray_cluster):
                if " ".join(p.cmdline()).startswith("ray::_EmbedActor"):
                    nices.append(p.nice())
                    p.kill()
                    killed.append("ray::_EmbedActor")

    hunter = threading.Thread(target=hunt_parser, daemon=True)
    hunter.start()
    try:
        report = ingest_on_cluster([docs], settings, ray_cluster.address, on_event=on_event)
    finally:
        stop.set()
        hunter.join(10)
    assert "ray::_parse_sent" in killed and "ray::_EmbedActor" in killed, killed
    # the launcher's nodes run their workers at the driver's priority, not Ray's nice 15 (the
    # embedder beside a driver at 0 waited for its CPU: eval/README.md, "Ray's cost per file")
    assert nices and set(nices) == {0}, nices
    assert report.failed == [] and report.added == ref_report.added == 3 and report.chunks == ref_report.chunks
    assert_same_store(snapshot(settings), ref)


@pytest.mark.complete
def test_cli_cluster_json_exit_codes_and_an_unreachable_cluster(ray_cluster, batch, tmp_path):
    from ragkit.cluster.local import free_port

    ragkit = _ragkit_cmd()
    env = dict(os.environ)
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(CORPORA / "cnli_dev_019.pdf", two)
    shutil.copy(batch / BAD, two)
    out = subprocess.run(ragkit + ["ingest", str(two), "--store", str(tmp_path / "s"), "--cluster", ray_cluster.address, "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert out.returncode == 1, out.stderr[-2000:]  # some input files failed, the others went in
    got = json.loads(out.stdout)
    assert got["added"] == 1 and [Path(f["path"]).name for f in got["failed"]] == [BAD] and got["chunks"] > 0

    # [cluster] address from the settings (here the environment), nothing to do: exit 0
    out = subprocess.run(ragkit + ["ingest", str(two / "cnli_dev_019.pdf"), "--store", str(tmp_path / "s"), "--json"],
                         capture_output=True, text=True, env=dict(env, RAGKIT_CLUSTER__ADDRESS=ray_cluster.address),
                         cwd=ROOT, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["unchanged"] == 1

    t0 = time.monotonic()
    dead = f"127.0.0.1:{free_port()}"
    out = subprocess.run(ragkit + ["ingest", str(two), "--store", str(tmp_path / "s2"), "--cluster", dead],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"cannot reach the Ray cluster at {dead}" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and time.monotonic() - t0 < 60


def test_cluster_settings():
    from ragkit.config import load_settings
    from ragkit.errors import ConfigError

    assert load_settings().cluster.address is None
    assert load_settings(cluster={"address": "auto"}).cluster.address == "auto"
    with pytest.raises(ConfigError):
        load_settings(cluster={"embedders": -1})


@pytest.mark.complete
def test_eval_run_on_the_cluster_with_an_actor_killed_records_each_question_once(ray_cluster, reference, tmp_path, capsys):
    """Retrieval-only eval of the demo set: questions answered by Ray actors (one retrieval load
    each), one killed -9 after the first record; answers.jsonl holds each question once, the
    same records as a local run, and a rerun resumes with nothing left to ask."""
    from ragkit.cluster.eval import answer_on_cluster
    from ragkit.eval.run import STAGES, RunOptions, run_eval

    settings, _, _ = reference
    set_path = ROOT / "eval" / "sets" / "nda-demo.jsonl"
    local = run_eval(RunOptions(set_path=set_path, out=tmp_path / "local", store=settings.store, retrieval_only=True))
    killed: list[int] = []

    def on_event(kind: str, info: dict) -> None:
        if kind == "answered" and not killed:
            for p in _cluster_procs(ray_cluster):
                if " ".join(p.cmdline()).startswith("ray::_AnswerActor"):
                    p.kill()
                    killed.append(p.pid)

    opts = RunOptions(set_path=set_path, out=tmp_path / "cluster", store=settings.store, retrieval_only=True)
    os.environ["RAGKIT_CLUSTER__EMBEDDERS"] = "1"  # one answering actor: 2 cores load one retrieval faster than two
    try:
        report = run_eval(opts, on_event=on_event, answer_many=answer_on_cluster(ray_cluster.address))
    finally:
        del os.environ["RAGKIT_CLUSTER__EMBEDDERS"]
    assert killed
    lines = [json.loads(x) for x in (tmp_path / "cluster" / "answers.jsonl").read_text().splitlines() if x.strip()]
    ref = {r["id"]: r for r in (json.loads(x) for x in (tmp_path / "local" / "answers.jsonl").read_text().splitlines() if x.strip())}
    assert sorted(r["id"] for r in lines) == sorted(ref)  # each question once
    strip = lambda r: {k: v for k, v in r.items() if k != "timings"}  # noqa: E731
    for r in lines:
        assert strip(r) == strip(ref[r["id"]]), r["id"]
    timing = lambda m: {k: v for k, v in m.items() if not k.startswith(STAGES)}  # noqa: E731  (wall clock differs)
    assert timing(report["metrics"]) == timing(local["metrics"]) and set(report) == set(local)
    assert "(raylet)" not in capsys.readouterr().out  # Ray's notes on the retries went to stderr

    events: list[str] = []
    run_eval(opts, on_event=lambda k, i: events.append(k), answer_many=answer_on_cluster(ray_cluster.address))
    assert "answered" not in events
    assert len((tmp_path / "cluster" / "answers.jsonl").read_text().splitlines()) == len(ref)


# in neither tier: CI runs `eval run --cluster ray://...` from a driver on another host
# (tests/test_hosts.py::test_the_evaluation_is_answered_on_b_and_c_through_the_engine_on_d_and_comes_back_to_a)
@pytest.mark.slow
def test_cli_eval_run_through_a_ray_client_address(ray_cluster, reference, tmp_path):
    """`ragkit eval run SET --cluster ray://HOST:PORT` from a driver outside the cluster (every Ray
    call through the head's Ray Client server): the same records and figures as a local run, exit
    0, the report's JSON on stdout; a second run resumes with nothing left to ask."""
    from ragkit.eval.run import STAGES, RunOptions, run_eval

    settings, _, _ = reference
    set_path = ROOT / "eval" / "sets" / "nda-demo.jsonl"
    local = run_eval(RunOptions(set_path=set_path, out=tmp_path / "local", store=settings.store, retrieval_only=True, limit=3))
    ragkit = _ragkit_cmd()
    cmd = ragkit + ["eval", "run", str(set_path), "--store", str(settings.store), "--retrieval-only", "--limit", "3",
                    "--out", str(tmp_path / "client"), "--cluster", ray_cluster.client_address, "--json"]
    env = dict(os.environ, RAGKIT_CLUSTER__EMBEDDERS="1")  # one answering actor: one retrieval load on 2 cores
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    actors: set[int] = set()  # the answering actors seen on the cluster while the command ran
    deadline = time.monotonic() + 600
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("ragkit eval run --cluster ray://... did not end within 600 s")
        for p in _cluster_procs(ray_cluster):
            try:
                if " ".join(p.cmdline()).startswith("ray::_AnswerActor"):
                    actors.add(p.pid)
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                pass
        time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    assert actors, "no answering actor ran on the cluster"
    got = json.loads(stdout)
    read = lambda d: {r["id"]: {k: v for k, v in r.items() if k != "timings"}  # noqa: E731
                      for r in (json.loads(x) for x in (d / "answers.jsonl").read_text().splitlines() if x.strip())}
    assert read(tmp_path / "client") == read(tmp_path / "local") and len(read(tmp_path / "local")) == 3
    timing = lambda m: {k: v for k, v in m.items() if not k.startswith(STAGES)}  # noqa: E731  (wall clock differs)
    assert timing(got["metrics"]) == timing(local["metrics"])
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and "resuming: 3 of 3 already answered" in again.stderr, again.stderr[-2000:]
    assert len((tmp_path / "client" / "answers.jsonl").read_text().splitlines()) == 3


# in neither tier: CI answers on two hosts' actors through a real engine on a third
# (tests/test_hosts.py::test_the_evaluation_is_answered_on_b_and_c_through_the_engine_on_d_and_comes_back_to_a)
@pytest.mark.slow
def test_eval_on_the_cluster_answers_through_an_engine_pool(ray_cluster, reference, tmp_path):
    """Two real `python -m llama_cpp.server` engines as the pool (cluster.engines): two answering
    actors, one per engine, each question answered and recorded once, both engines asked, and
    the answers those of a local run against one of the engines (same model, greedy)."""
    from test_openai_backend import Server

    from ragkit.cluster.eval import answer_on_cluster
    from ragkit.eval.run import RunOptions, run_eval

    settings, _, _ = reference
    set_path = ROOT / "eval" / "sets" / "nda-demo.jsonl"
    engines = [Server(tmp_path / f"engine{i}.log") for i in range(2)]
    env = {"RAGKIT_GENERATOR__MAX_TOKENS": "32", "RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_RETRIEVE__TOP_K": "2"}
    try:
        os.environ.update(env)
        os.environ["RAGKIT_GENERATOR__BACKEND"] = "openai"
        os.environ["RAGKIT_GENERATOR__BASE_URL"] = engines[0].url
        local = run_eval(RunOptions(set_path=set_path, out=tmp_path / "local", store=settings.store, limit=2))
        del os.environ["RAGKIT_GENERATOR__BACKEND"], os.environ["RAGKIT_GENERATOR__BASE_URL"]
        os.environ["RAGKIT_CLUSTER__ENGINES"] = json.dumps([e.url for e in engines])
        before = [e.log.read_text().count("POST /v1/") for e in engines]
        report = run_eval(RunOptions(set_path=set_path, out=tmp_path / "pool", store=settings.store, limit=2),
                          answer_many=answer_on_cluster(ray_cluster.address))
        asked = [e.log.read_text().count("POST /v1/") - b for e, b in zip(engines, before)]
    finally:
        for k in [*env, "RAGKIT_CLUSTER__ENGINES", "RAGKIT_GENERATOR__BACKEND", "RAGKIT_GENERATOR__BASE_URL"]:
            os.environ.pop(k, None)
        for e in engines:
            e.stop()
    recs = [json.loads(x) for x in (tmp_path / "pool" / "answers.jsonl").read_text().splitlines() if x.strip()]
    ref = {r["id"]: r for r in (json.loads(x) for x in (tmp_path / "local" / "answers.jsonl").read_text().splitlines() if x.strip())}
    assert sorted(r["id"] for r in recs) == sorted(ref) and len(recs) == 2
    assert all(a > 0 for a in asked), asked  # each engine of the pool answered
    for r in recs:
        assert r["status"] == "ok" and r["answer"] and r["answer"] == ref[r["id"]]["answer"], r["id"]
    assert set(report) == set(local)


# ---------------------------------------------------------------------- a Chroma server behind the cluster

SERVER_DOCS = ("ai-osi-stack-mutual-nda.md", "bonterms-mutual-nda-v1.pdf", "cnli_dev_019.pdf")


def _server_settings(url: str, collection: str, base: Path):
    return make_settings(base / "unused-local-store").model_copy(
        update={"store_url": url, "collection": collection, "cache_dir": base / "cache"})


@pytest.mark.complete
def test_review_on_the_cluster_equals_a_local_review_and_is_logged_once_a_contract(ray_cluster, reference, tmp_path):
    """`ragkit review --cluster`: the contracts reviewed by Ray actors (each with its own
    session and the checklist's kinds model) come back with the findings a local review gives,
    each logged once; a second run reads them all back from the log."""
    from ragkit.cluster.review import review_on_cluster
    from ragkit.compare.review import review
    from ragkit.session import Session

    settings, _, _ = reference
    session = Session(settings)
    names = sorted(r.name for r in session.store.documents())[:3]
    items = ["governing-law", "anti-assignment"]

    def findings(rv):
        return {c.doc: {k: [(e.text, e.score, e.page) for e in v] for k, v in c.findings.items()} for c in rv.contracts}

    local = review(names, session, "cuad", items=items)
    log = tmp_path / "review.log.jsonl"
    remote = review(names, session, "cuad", items=items, log=log, review_many=review_on_cluster(ray_cluster.address))
    assert [c.doc for c in remote.contracts] == names and remote.resumed == 0
    assert findings(remote) == findings(local)
    assert sorted(json.loads(line)["doc"] for line in log.read_text().splitlines()) == names
    again = review(names, session, "cuad", items=items, log=log, review_many=review_on_cluster(ray_cluster.address))
    assert again.resumed == 3 and findings(again) == findings(local)


@pytest.fixture(scope="module")
def server_reference(chroma_server, tmp_path_factory):  # noqa: F811  (the imported fixture)
    """Three NDAs ingested locally (one process) into their own collection of a real `chroma run` server."""
    from ragkit.ingest import ingest

    base = tmp_path_factory.mktemp("cluster-server")
    docs = base / "docs"
    docs.mkdir()
    for name in SERVER_DOCS:
        shutil.copy(CORPORA / name, docs / name)
    settings = _server_settings(chroma_server, "local-ref", base)
    report = ingest([docs], settings, overlap=False)
    assert report.failed == [] and report.added == len(SERVER_DOCS)
    return chroma_server, docs, report, snapshot(settings)


@pytest.mark.complete
def test_cluster_ingest_into_a_chroma_server_equals_a_local_ingest_into_it(ray_cluster, server_reference, tmp_path):
    from ragkit.cluster import ingest_on_cluster
    from ragkit.store import StoreWriter

    url, docs, ref_report, ref = server_reference
    settings = _server_settings(url, "on-the-cluster", tmp_path)
    report = ingest_on_cluster([docs], settings, ray_cluster.address)
    assert report.failed == [] and report.added == len(SERVER_DOCS)
    assert (report.chunks, report.chunks_embedded) == (ref_report.chunks, ref_report.chunks_embedded)
    assert report.timings["cluster_nodes"] == 2 and report.timings["embed_actors"] == 2
    assert_same_store(snapshot(settings), ref)  # same records, chunk ids, texts, metadata; vectors within 1e-3
    assert not (tmp_path / "unused-local-store" / "chroma").exists(), "server mode wrote an embedded store"
    with StoreWriter(settings):  # the driver's lease in the server was released: the next writer takes it at once
        pass


# A driver killed -9 at its worst moment: the second document's chunks written, its record
# not. The server lease is shortened to LEASE_S in that process only (60 s otherwise).
LEASE_S = 4.0
_KILL_DRIVER = """
import os, signal, sys
from pathlib import Path
from ragkit.cluster import ingest_on_cluster
from ragkit.config import load_settings
from ragkit.store import ChromaStore
from ragkit.store.locks import ServerLease

docs, url, collection, cache, address, lease_s = sys.argv[1:]
ServerLease.__init__.__kwdefaults__["lease_s"] = float(lease_s)
commit, commits = ChromaStore.commit_document, []

def commit_or_die(self, record):
    commits.append(record.name)
    if len(commits) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    commit(self, record)

ChromaStore.commit_document = commit_or_die
settings = load_settings(store=Path(cache) / "unused", store_url=url, collection=collection, cache_dir=Path(cache),
                         generator={"n_ctx": 2048, "max_tokens": 96})
ingest_on_cluster([Path(docs)], settings, address)
"""


@pytest.mark.complete
def test_a_driver_killed_mid_ingest_leaves_no_partial_document_and_a_rerun_completes(ray_cluster, server_reference,
                                                                                      tmp_path):
    from ragkit.cluster import ingest_on_cluster
    from ragkit.embed import load_embedder
    from ragkit.errors import StoreLocked
    from ragkit.retrieve import retrieve
    from ragkit.store import StoreWriter, open_store

    url, docs, ref_report, ref = server_reference
    settings = _server_settings(url, "killed-driver", tmp_path)
    proc = subprocess.run([sys.executable, "-c", _KILL_DRIVER, str(docs), url, settings.collection,
                           str(settings.cache_dir), ray_cluster.address, str(LEASE_S)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-3000:]
    t_killed = time.monotonic()

    # readers see the one committed document whole, nothing of the one whose record never came
    st = open_store(settings, load_embedder(settings), create=False)
    records = st.documents()
    assert len(records) == 1
    rec = records[0]
    assert (rec.name, rec.doc_id, rec.sha256, rec.n_chunks, rec.n_sections, rec.n_pages) in ref["docs"]
    assert len(st.chunks([rec.doc_id])) == rec.n_chunks
    assert st.count() > rec.n_chunks  # the second document's chunks are in the server, without a record ...
    for q in ("Which law governs this agreement?", "What is confidential information?"):
        assert {c.doc for c in retrieve(q, settings).prompt.contexts} <= {rec.name}  # ... and no reader sees them

    # the dead driver's lease holds until it expires; then a re-run takes it and completes
    if time.monotonic() - t_killed < LEASE_S - 1:
        with pytest.raises(StoreLocked):
            with StoreWriter(settings):
                pass
    report = ingest_on_cluster([docs], settings, ray_cluster.address, wait_s=LEASE_S + 30)
    assert report.failed == [] and (report.added, report.unchanged) == (len(SERVER_DOCS) - 1, 1)
    assert_same_store(snapshot(settings), ref)  # as a clean ingest: the orphaned chunks are gone, none twice


# ---------------------------------------------------------------------- nothing but loopback, by the kernel's view

@pytest.mark.complete
def test_the_cluster_and_a_cli_driver_reach_nothing_but_loopback(ray_cluster, batch, tmp_path):
    """Every process of the cluster (launchers, GCS, raylets, agents, every worker and actor
    the tests above ran) has been under `strace -f` since the cluster started; here a CLI
    driver runs `ragkit ingest --cluster` under strace too, with an environment without
    ragkit's offline switches. Every connect / send address in all the traces is loopback
    or AF_UNIX, and no name is looked up (tests/test_network.py's parser)."""
    from conftest import in_ci
    from test_network import RAGKIT, TRACED, _strace_cmd, assert_traced_whole_process, offending_lines, traced

    if not ray_cluster.traces:
        if in_ci():
            pytest.fail("strace cannot trace here: the OS-level network check must run in CI")
        pytest.skip("strace is not installed or cannot trace here")
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("cnli_dev_019.pdf", "ai-osi-stack-mutual-nda.md"):
        shutil.copy(CORPORA / name, docs / name)
    strace = _strace_cmd(tmp_path / "probe.strace")[:-2]
    assert f"trace={TRACED}" in strace
    argv = [*RAGKIT, "ingest", str(docs), "--store", str(tmp_path / "s"), "--cluster", ray_cluster.address, "--json"]
    res, driver, _ = traced(strace, tmp_path / "driver.strace", argv, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["added"] == 2  # parsed in Ray tasks, embedded by the actors
    assert_traced_whole_process(driver, argv[0])
    assert offending_lines(driver) == []

    cluster = {p.name: p.read_text(errors="replace") for p in ray_cluster.traces}
    traced_pids = {ln.split()[0] for t in cluster.values() for ln in t.splitlines() if ln.split()}
    tracers = {p.pid for p in ray_cluster.procs}  # the strace processes themselves
    live = {str(p.pid): p.name() for p in ray_cluster.processes() if p.pid not in tracers}
    assert live and set(live) <= traced_pids, {pid: c for pid, c in live.items() if pid not in traced_pids}
    for name, trace in cluster.items():
        assert re.search(r'connect\(\d+, \{sa_family=AF_INET, sin_port=htons\(\d+\), sin_addr=inet_addr\("127\.0\.0\.1"\)', trace), name
        assert offending_lines(trace) == [], name
    assert {"raylet", "gcs_server"} <= set(live.values()), live  # the cluster's own servers were among them
