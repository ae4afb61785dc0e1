"""`ingest --cluster`: the sample NDAs through a real two-node Ray cluster on loopback (two
raylets, so tasks and actors cross node boundaries), against a local single-process ingest.
The cluster is started by the session fixture and stopped (its process groups killed) at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from conftest import CORPORA, ROOT, make_settings

BAD = "broken-scan.pdf"


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    from ragkit.cluster import local

    temp = Path(f"/tmp/rk-ray-{os.getpid()}")  # Ray's socket paths must stay short (AF_UNIX: 107 bytes)
    shutil.rmtree(temp, ignore_errors=True)
    cluster = local.start(temp, nodes=2, cpus_per_node=1)
    yield cluster
    procs = cluster.processes()
    cluster.stop(grace_s=5)
    shutil.rmtree(temp, ignore_errors=True)
    left = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"cluster processes left running: {left}"


def _cluster_procs(cluster) -> list[psutil.Process]:
    return cluster.processes()


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


def test_parse_worker_and_embedders_killed_mid_ingest_lose_and_duplicate_nothing(ray_cluster, slow_batch, tmp_path):
    """kill -9 a parse task's worker two seconds into its parse (the scanned page's OCR), and
    the embedder actors after the first commit: Ray re-runs the parse and restarts the actors
    (their batches re-sent); the store ends as the local ingest's, each chunk once."""
    import threading

    from ragkit.cluster import ingest_on_cluster

    docs, ref_report, ref = slow_batch
    settings = make_settings(tmp_path / "s")
    killed: list[str] = []
    stop = threading.Event()

    def hunt_parser() -> None:
        first_seen: dict[int, float] = {}
        while not stop.is_set():
            for p in ray_cluster.processes():
                try:
                    busy = " ".join(p.cmdline()).startswith("ray::_parse_one")
                except psutil.Error:
                    continue
                if not busy:
                    first_seen.pop(p.pid, None)
                elif time.monotonic() - first_seen.setdefault(p.pid, time.monotonic()) > 2.0:
                    p.kill()
                    killed.append("ray::_parse_one")
                    return
            time.sleep(0.1)

    def on_event(kind: str, info: dict) -> None:
        if kind == "file" and "ray::_EmbedActor" not in killed:
            for p in _cluster_procs(ray_cluster):
                if " ".join(p.cmdline()).startswith("ray::_EmbedActor"):
                    p.kill()
                    killed.append("ray::_EmbedActor")

    hunter = threading.Thread(target=hunt_parser, daemon=True)
    hunter.start()
    try:
        report = ingest_on_cluster([docs], settings, ray_cluster.address, on_event=on_event)
    finally:
        stop.set()
        hunter.join(10)
    assert "ray::_parse_one" in killed and "ray::_EmbedActor" in killed, killed
    assert report.failed == [] and report.added == ref_report.added == 3 and report.chunks == ref_report.chunks
    assert_same_store(snapshot(settings), ref)


def test_cli_cluster_json_exit_codes_and_an_unreachable_cluster(ray_cluster, batch, tmp_path):
    from ragkit.cluster.local import free_port

    ragkit = [sys.executable, "-m", "ragkit.cli"] if not (Path(sys.executable).parent / "ragkit").exists() else [
        str(Path(sys.executable).parent / "ragkit")]
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
