"""Reliability: kill -9 mid-ingest, readers during writes, store compatibility, bad inputs.
(No network: tests/test_network.py traces the real CLI at the OS level.)"""

from __future__ import annotations

import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPORA, ROOT, make_settings

from ragkit.embed import load_embedder
from ragkit.errors import StoreError
from ragkit.ingest import ingest
from ragkit.store import lexical, open_store


def snapshot(settings) -> dict:
    """What a reader can observe, plus the raw state a crash could corrupt."""
    st = open_store(settings, load_embedder(settings), create=False)
    recs = st.documents()
    live = {r.doc_id for r in recs}
    got = st.col.get(include=["metadatas", "embeddings"])
    ids = list(got["ids"])
    folder = lexical.index_dir(settings.store, None, settings.collection, settings.cache_dir)
    ix = lexical.BM25Index.load(folder)
    return {
        # the embedding cache's state: each record's key (its text's hash) and vector
        "text_hash": {i: m.get("text_hash") for i, m in zip(ids, got["metadatas"])},
        "vectors": {i: np.asarray(e, dtype=np.float32) for i, e in zip(ids, got["embeddings"])},
        "docs": sorted((r.name, r.doc_id, r.n_chunks) for r in recs),
        "chunk_ids": sorted(ids),
        "duplicates": len(ids) - len(set(ids)),
        "orphans": sorted({m["doc_id"] for m in got["metadatas"] if m["doc_id"] not in live}),
        "bm25_ids": sorted(ix.ids) if ix else None,
        "bm25_fp_ok": bool(ix) and ix.fp == lexical.fingerprint(sorted(live)),
    }


def make_corpus(corpus: Path) -> None:
    """The NDA corpus plus a variant of its first file with one clause changed, sorted last:
    a kill never lands after its commit, so the re-run embeds it, and all but its changed
    chunk come from the embedding cache (the first file is always committed)."""
    shutil.copytree(CORPORA, corpus)
    base = (CORPORA / "ai-osi-stack-mutual-nda.md").read_text()
    assert "three (3) years" in base
    (corpus / "zz-variant-nda.md").write_text(base.replace("three (3) years", "four (4) years"))


@pytest.fixture(scope="module")
def clean_reference(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("ref") / "nda"
    make_corpus(corpus)
    settings = make_settings(tmp_path_factory.mktemp("refstore") / "s")
    ingest([corpus], settings)
    return snapshot(settings)


_COMMITTED = re.compile(r"^\s+(added|updated)\s+\S")  # the CLI's per-file line, printed after the commit


def _kill_trial(tmp_path: Path, seed: int, ref: dict) -> tuple[dict, str, int]:
    """Run `ragkit ingest` in a child and kill -9 it between its first and its last commit.

    The kill point comes from the child's own progress: after its k-th committed
    document (k random in 1..n-2), wait a random fraction of the time its last document
    took, or until the next commit if that comes first, then SIGKILL. The store, read
    after the child is dead, says how many documents it had committed: at least one and
    not all, each one complete. Then a re-run in this process finishes the job."""
    rng = random.Random(seed)
    corpus = tmp_path / "nda"
    if not corpus.exists():
        make_corpus(corpus)
    n = len(ref["docs"])
    assert n >= 3
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "ragkit.cli", "ingest", str(corpus), "--store", str(store)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, bufsize=1)
    commits: queue.Queue = queue.Queue()

    def read_progress():
        for line in proc.stderr:
            if _COMMITTED.match(line):
                commits.put(time.monotonic())
        commits.put(None)  # the child's stderr closed

    threading.Thread(target=read_progress, daemon=True).start()
    target = rng.randint(1, n - 2)
    frac = rng.uniform(0.0, 0.9)
    times: list[float] = []
    try:
        while len(times) < target:
            t = commits.get(timeout=300)
            assert t is not None, f"seed {seed}: the child ended after {len(times)} commits (exit {proc.wait()})"
            times.append(t)
        took = times[-1] - (times[-2] if len(times) > 1 else t0)
        try:
            if (t := commits.get(timeout=frac * took)) is not None:  # the next commit cuts the wait short
                times.append(t)
        except queue.Empty:
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    settings = make_settings(store)
    try:
        st = open_store(settings, load_embedder(settings), create=False)
    except StoreError as exc:
        pytest.fail(f"seed {seed}: killed before the first commit ({exc})")
    recs = st.documents()
    where = (f"seed {seed}: killed {frac:.2f} x {took:.1f}s after commit {target} of {n}; "
             f"the store holds {len(recs)} committed documents")
    assert len(times) <= len(recs) < n, where  # mid-ingest: at least what it printed, not all
    assert {(r.name, r.doc_id, r.n_chunks) for r in recs} <= set(ref["docs"]), where
    for r in recs:  # every committed document is complete
        assert st.has_chunks(r.doc_id) == r.n_chunks, (where, r.name)
    report = ingest([corpus], settings)  # the next run completes it
    assert report.failed == [], where
    assert report.added == n - len(recs) and report.unchanged == len(recs), (where, report.to_json())
    assert report.chunks_from_cache > 0, (where, report.to_json())  # the re-run took vectors from the cache
    print(where)
    return snapshot(settings), where, len(recs)


def _check_equal(snap: dict, ref: dict, where: str) -> None:
    assert snap["docs"] == ref["docs"], where
    assert snap["chunk_ids"] == ref["chunk_ids"], where
    assert snap["duplicates"] == 0 and snap["orphans"] == [], where
    assert snap["bm25_ids"] == ref["chunk_ids"] and snap["bm25_fp_ok"], where
    # every stored vector is the embedding of its record's text: the cache keys match a
    # clean ingest's, and each vector is the clean ingest's vector for that text (up to
    # the noise of other batch shapes), nearer to it than to any other text's vector
    assert snap["text_hash"] == ref["text_hash"] and None not in ref["text_hash"].values(), where
    ids = sorted(ref["vectors"])
    R = np.stack([ref["vectors"][i] for i in ids])
    S = np.stack([snap["vectors"][i] for i in ids])
    sims = S @ R.T
    for row, i in enumerate(ids):
        assert sims[row, row] > 0.999, (where, i, float(sims[row, row]))
        nearest = ids[int(np.argmax(sims[row]))]
        assert ref["text_hash"][nearest] == ref["text_hash"][i], (where, i, nearest)


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_mid_ingest_then_rerun_equals_a_clean_ingest(tmp_path, clean_reference, seed):
    snap, where, committed = _kill_trial(tmp_path, seed, clean_reference)
    assert 1 <= committed < len(clean_reference["docs"]), where  # it died mid-ingest
    _check_equal(snap, clean_reference, where)


@pytest.mark.slow
def test_kill_9_twenty_trials(tmp_path, clean_reference):
    survived = 0
    for seed in range(100, 120):
        trial = tmp_path / f"t{seed}"
        trial.mkdir()
        snap, where, _committed = _kill_trial(trial, seed, clean_reference)
        _check_equal(snap, clean_reference, where)
        survived += 1
    print(f"kill -9 trials survived: {survived}/20")
    assert survived == 20


@pytest.mark.complete
def test_reader_during_writes_sees_one_version(tmp_path):
    """A reader asking while a writer replaces a document over and over sees complete
    sources of one version, never a mix of two versions or a partial set."""
    from ragkit.generate import load_generator
    from ragkit.retrieve import retrieve

    corpus = tmp_path / "docs"
    corpus.mkdir()
    md = corpus / "nda.md"
    base = (CORPORA / "ai-osi-stack-mutual-nda.md").read_text()
    md.write_text(base.replace("three (3) years", "version 0 years"))
    settings = make_settings(tmp_path / "store", n_ctx=8192, max_tokens=64)
    ingest([corpus], settings)
    gen = load_generator(settings, vocab_only=True)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        try:
            for v in range(1, 5):
                md.write_text(base.replace("three (3) years", f"version {v} years"))
                ingest([corpus], settings, wait_s=30)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            stop.set()

    t = threading.Thread(target=writer)
    t.start()
    seen_versions = set()
    version_of: dict[str, set[str]] = {}  # doc_id -> the versions read with it
    reads = 0
    while not stop.is_set() or reads == 0:
        prompt = retrieve("How many years do obligations survive?", settings, ["nda.md"], generator=gen).prompt
        assert prompt.mode == "whole"
        versions = {w for c in prompt.contexts for w in ["version 0", "version 1", "version 2", "version 3", "version 4"] if w in c.text}
        assert len(versions) == 1, versions
        assert len({c.doc_id for c in prompt.contexts}) == 1
        assert sorted(c.chunk_index for c in prompt.contexts) == list(range(len(prompt.contexts)))  # all of it
        version_of.setdefault(prompt.contexts[0].doc_id, set()).update(versions)
        seen_versions |= versions
        reads += 1
    t.join()
    assert not errors, errors
    assert reads >= 2
    # the reads overlapped the writes: they saw the document change under them
    assert len(seen_versions) >= 2, (seen_versions, reads)
    # one content hash, one text: no read paired one version's record with another's chunks
    assert all(len(v) == 1 for v in version_of.values()), version_of
    assert len(version_of) == len(seen_versions)


def test_store_from_a_newer_ragkit_or_other_embedder_is_refused(tmp_path):
    settings = make_settings(tmp_path / "store")
    ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    st = open_store(settings, load_embedder(settings), create=False)
    meta = dict(st.col.metadata)
    meta["schema"] = 99
    meta["ragkit"] = "9.0.0"
    st.col.modify(metadata=meta)
    with pytest.raises(StoreError, match="newer ragkit"):
        open_store(settings, load_embedder(settings), create=False)
    from typer.testing import CliRunner

    from ragkit.cli import app

    res = CliRunner().invoke(app, ["ask", "x?", "--store", str(settings.store), "--dry-run"])
    assert res.exit_code == 4 and "newer ragkit" in res.output and "Traceback" not in res.output


def test_a_schema_1_store_is_read_in_full_and_migrated_by_the_next_writer(tmp_path):
    """Store item 1: the store-version row came in without a schema bump, so an older writer
    (schema 1) that commits without bumping it left new readers on a stale record list.
    Now: schema 2; a schema-1 store is read in full (never from the version-keyed list) and
    the first writer migrates it; an older ragkit then refuses it as newer."""
    from ragkit.store import _VERSION_ID, SCHEMA_VERSION, DocRecord

    assert SCHEMA_VERSION == 2
    settings = make_settings(tmp_path / "store")
    ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    st = open_store(settings, load_embedder(settings), create=False)
    assert st.col.metadata["schema"] == 2 and st.docs.get(ids=[_VERSION_ID])["ids"]
    # make it the store an older ragkit wrote: schema 1 on both collections
    for col in (st.col, st.docs):
        col.modify(metadata={**{k: v for k, v in (col.metadata or {}).items() if not k.startswith("hnsw:")}, "schema": 1})
    old = open_store(settings, load_embedder(settings), create=False)
    assert old.schema == 1 and [r.name for r in old.documents()] == ["cnli_dev_019.pdf"]
    # an older writer commits a record without bumping the version row: a reader sees it at once
    rec = old.documents()[0]
    twin = DocRecord.from_meta("twin-key", {**rec.to_meta(), "name": "twin.pdf"})
    old.docs.upsert(ids=["twin-key"], embeddings=[[0.0]], metadatas=[twin.to_meta()])
    assert [r.name for r in old.documents()] == ["cnli_dev_019.pdf", "twin.pdf"]
    old.docs.delete(ids=["twin-key"])
    assert [r.name for r in old.documents()] == ["cnli_dev_019.pdf"]
    # the next writer migrates it, keeping every record and chunk
    n_chunks = old.count()
    report = ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    assert report.failed == [] and report.unchanged == 1
    new = open_store(settings, load_embedder(settings), create=False)
    assert new.schema == 2 and new.col.metadata["schema"] == 2 and new.docs.metadata["schema"] == 2
    assert [r.name for r in new.documents()] == ["cnli_dev_019.pdf"] and new.count() == n_chunks
    assert new.docs.get(ids=[_VERSION_ID])["ids"] == [_VERSION_ID]


def test_forty_malformed_files_one_clear_line_each_and_the_store_is_untouched(tmp_path):
    """≥40 bad inputs through the real CLI: each is named once with its reason, exit 1,
    no traceback, a good file in the same batch goes in, and what was ingested before
    is unchanged byte for byte."""
    import json

    from badfiles import make_many_bad_files

    store = tmp_path / "store"
    settings = make_settings(store)
    ingest([CORPORA / "cnli_dev_411.pdf"], settings)
    st = open_store(settings, load_embedder(settings), create=False)
    before = st.col.get(include=["documents", "metadatas"])
    bad = tmp_path / "bad"
    expect = make_many_bad_files(bad, CORPORA / "cnli_dev_019.pdf", CORPORA / "cnli_dev_054.docx")
    assert len(expect) >= 40
    shutil.copy(CORPORA / "bonterms-mutual-nda-v1.pdf", bad / "good.pdf")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ragkit.cli", "ingest", str(bad), "--store", str(store), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    out = json.loads(r.stdout)
    failed = {Path(f["path"]).name: f["error"] for f in out["failed"]}
    assert set(failed) == set(expect) - {"notes.xyz"}, set(expect) ^ set(failed)  # .xyz is skipped in folders
    for name, word in expect.items():
        if name in failed:
            assert word.lower() in failed[name].lower(), (name, failed[name])
            assert "\n" not in failed[name]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip().startswith("failed")]
    for name in failed:
        assert sum(name in ln for ln in lines) == 1, name
    assert out["added"] == 1  # good.pdf
    after = open_store(settings, load_embedder(settings), create=False).col.get(include=["documents", "metadatas"])
    old = {i: (d, m) for i, d, m in zip(before["ids"], before["documents"], before["metadatas"])}
    new = {i: (d, m) for i, d, m in zip(after["ids"], after["documents"], after["metadatas"])}
    assert all(new[i] == old[i] for i in old), "a previously ingested chunk changed"
    print(f"{len(expect)} malformed files, {len(failed)} reported, {elapsed:.1f}s")


def test_a_file_that_vanishes_mid_run_is_reported_and_the_batch_goes_on(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in ["cnli_dev_019.pdf", "cnli_dev_411.pdf", "ai-osi-stack-mutual-nda.md"]:
        shutil.copy(CORPORA / name, corpus / name)
    victim = corpus / "cnli_dev_411.pdf"

    def on_event(kind, info):
        if kind == "file" and victim.exists():
            victim.unlink()  # gone after discovery, before its turn

    report = ingest([corpus], make_settings(tmp_path / "s"), on_event=on_event)
    assert [Path(f["path"]).name for f in report.failed] == ["cnli_dev_411.pdf"]
    assert "vanished" in report.failed[0]["error"]
    assert report.added == 2


def test_in_ci_a_skip_fails_the_run_and_an_xfail_does_not(tmp_path):
    """conftest.py's hooks, loaded into a scratch suite: with CI set, a skipped test (by
    mark or by pytest.skip) is a failure; without CI it stays a skip."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('ragkit_suite_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "pytest_runtest_makereport = mod.pytest_runtest_makereport\n"
        "pytest_make_collect_report = mod.pytest_make_collect_report\n"
    )
    (tmp_path / "test_scratch.py").write_text(
        "import pytest\n"
        "@pytest.mark.skipif(True, reason='a tool is missing')\n"
        "def test_marked(): pass\n"
        "def test_called(): pytest.skip('data is missing')\n"
        "@pytest.mark.xfail(reason='known bug', strict=True)\n"
        "def test_xfail(): assert False\n"
        "def test_plain(): pass\n"
    )
    (tmp_path / "test_module_skip.py").write_text("import pytest\npytest.skip('whole module', allow_module_level=True)\n")

    def run(**env):
        base = {k: v for k, v in os.environ.items() if k != "CI"}
        r = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider", "-rA",
                            "--continue-on-collection-errors"],
                           cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=300)
        return r.returncode, r.stdout

    rc, out = run(CI="1")
    assert rc == 1, out
    assert re.search(r"ERROR .*test_marked - skipped in CI.*a tool is missing", out), out  # skipped at setup
    assert re.search(r"FAILED .*test_called - skipped in CI.*data is missing", out), out
    assert re.search(r"ERROR .*test_module_skip.py - skipped in CI.*whole module", out), out
    assert "XFAIL" in out and re.search(r"PASSED .*test_plain", out), out
    rc, out = run()
    assert rc == 0, out
    assert re.search(r"\b1 passed, 3 skipped, 1 xfailed\b", out) and "skipped in CI" not in out, out


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of 48 MB (tmpfs, mounted as root, as CI runs), unmounted after."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here (needs root): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(disk: Path) -> Path:
    """Fill the filesystem to the last byte: one file, written (unbuffered) until ENOSPC."""
    filler = disk / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 16, 4096, 512, 1):
            while True:
                try:
                    if os.write(fd, b"\0" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def _consistent(settings) -> list[str]:
    st = open_store(settings, load_embedder(settings), create=False)
    for r in st.documents():  # every committed record has all of its chunks
        assert st.has_chunks(r.doc_id) == r.n_chunks, r.name
    return sorted(r.name for r in st.documents())


@pytest.mark.complete
def test_a_full_disk_stops_the_ingest_with_a_store_error_and_loses_nothing(small_disk):
    """Store item 5: a write that fails on a full disk is one exit-4 line naming the store and
    the reason, never a traceback; what was committed before stays whole and readable, and
    once space is freed the same command completes. The disk is left with 0, 200 KB and
    400 KB free, so the failure lands at different writes (Chroma's open, its log, its
    compaction, the sidecars...)."""
    import json

    store = small_disk / "store"
    settings = make_settings(store)
    assert ingest([CORPORA / "cnli_dev_019.pdf"], settings).failed == []
    cmd = [sys.executable, "-m", "ragkit.cli", "ingest", str(CORPORA / "cnli_dev_411.pdf"), str(CORPORA / "cnli_dev_054.docx"),
           "--store", str(store), "--json"]
    refused = 0
    for slack in (0, 200_000, 400_000):
        filler = _fill(small_disk)
        os.truncate(filler, max(0, filler.stat().st_size - slack))
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode in (0, 4), (slack, res.returncode, res.stdout[-2000:], res.stderr[-2000:])
        assert "Traceback" not in res.stderr + res.stdout
        if res.returncode == 4:
            refused += 1
            err = json.loads(res.stdout.strip().splitlines()[-1])
            assert err["exit_code"] == 4 and str(store) in err["error"] and "full" in err["error"], err
        filler.unlink()
        assert "cnli_dev_019.pdf" in _consistent(settings)  # committed before: whole
    assert refused >= 1
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _consistent(settings) == ["cnli_dev_019.pdf", "cnli_dev_054.docx", "cnli_dev_411.pdf"]


@pytest.mark.complete
@pytest.mark.parametrize("blocked", ["sidecars", "bm25"])
def test_an_unwritable_index_or_sidecar_folder_is_a_store_error(tmp_path, blocked):
    """Store item 5: the sidecars and the lexical index are written durably (flushed, then
    renamed in); when they cannot be written at all (here a plain file sits where their
    folder must be: a real OSError, as root too) the ingest stops with exit 4 naming the
    path, and the store's records stay whole."""
    import json

    store = tmp_path / "store"
    settings = make_settings(store)
    assert ingest([CORPORA / "cnli_dev_019.pdf"], settings).failed == []
    target = store / blocked
    shutil.rmtree(target)
    target.write_text("not a folder")
    cmd = [sys.executable, "-m", "ragkit.cli", "ingest", str(CORPORA / "cnli_dev_411.pdf"), "--store", str(store), "--json"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 4 and "Traceback" not in res.stderr, (res.stdout[-2000:], res.stderr[-2000:])
    err = json.loads(res.stdout.strip().splitlines()[-1])
    assert f"cannot write {target}" in err["error"], err
    target.unlink()
    assert "cnli_dev_019.pdf" in _consistent(settings)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _consistent(settings) == ["cnli_dev_019.pdf", "cnli_dev_411.pdf"]
