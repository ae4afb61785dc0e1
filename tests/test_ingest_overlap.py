"""Parsing in worker processes, ahead of the embedder: the same store and the same
per-file messages as parsing in-process, commits in file order, a crashed parser fails
only its file, and Ctrl-C / kill -9 leave no worker behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPORA, ROOT, make_settings

from ragkit.embed import load_embedder
from ragkit.ingest import ingest
from ragkit.ingest.pipeline import _Parsers
from ragkit.store import open_store


def _state(settings) -> dict:
    st = open_store(settings, load_embedder(settings), create=False)
    got = st.col.get(include=["documents", "metadatas", "embeddings"])
    return {i: (d, m, np.asarray(e)) for i, d, m, e in zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"])}


def test_workers_give_the_same_store_messages_and_commit_order_as_parsing_in_process(tmp_path):
    from badfiles import make_bad_files

    corpus = tmp_path / "mixed"
    expect = make_bad_files(corpus, CORPORA / "cnli_dev_019.pdf", CORPORA / "cnli_dev_054.docx")
    for name in ["cnli_dev_019.pdf", "ai-osi-stack-mutual-nda.md", "cnli_dev_054.docx"]:
        shutil.copy(CORPORA / name, corpus / f"good-{name}")
    runs = {}
    for label, kw in [("workers", {"overlap": True}), ("in-process", {"overlap": False})]:
        settings = make_settings(tmp_path / f"store-{label}")
        settings.ingest.workers = 2
        events: list[tuple[str, str]] = []
        rep = ingest([corpus], settings, on_event=lambda k, i: events.append((k, i.get("path"))) if k in ("file", "failed") else None, **kw)
        runs[label] = (rep, events, _state(settings))
    (rw, ew, sw), (rs, es, ss) = runs["workers"], runs["in-process"]
    assert rw.workers == 2 and rs.workers == 0
    assert rw.failed == rs.failed  # the same files, the same reasons, in the same order
    assert {Path(f["path"]).name for f in rw.failed} >= {n for n in expect if n != "notes.xyz"}
    for f in rw.failed:
        word = expect.get(Path(f["path"]).name)
        assert word is None or word.lower() in f["error"].lower(), f
    assert rw.added == rs.added == 3
    assert ew == es  # commits and failures come in file order
    assert [p for _, p in ew] == sorted(p for _, p in ew)
    assert sw.keys() == ss.keys()
    for i in sw:
        assert sw[i][0] == ss[i][0] and sw[i][1] == ss[i][1], i
        assert np.allclose(sw[i][2], ss[i][2], atol=1e-5), i
    assert rw.pages == rs.pages > 0


def _stand_in_parse(path: str, settings=None) -> tuple:
    """A stand-in parse job (this test is about the pool, not the parser): a file named
    crash-* kills its worker process the way a crashing native parser would."""
    if Path(path).name.startswith("crash-"):
        os._exit(11)
    return ("ok", [], 0, None, 0.0, {})


def test_a_parser_that_kills_its_worker_fails_only_its_file(tmp_path):
    settings = make_settings(tmp_path / "store")
    done = []
    parsers = _Parsers(settings, 2, lambda p, r: done.append(p), job=_stand_in_parse)
    files = [str(tmp_path / n) for n in ["a.pdf", "b.pdf", "crash-c.pdf", "d.pdf", "e.pdf"]]
    try:
        parsers.plan(files)
        results = {Path(f).name: parsers.result(f) for f in files}
    finally:
        parsers.close(kill=True)
    assert results["crash-c.pdf"][0] == "error" and "crashed" in results["crash-c.pdf"][1]
    assert all(results[n][0] == "ok" for n in ["a.pdf", "b.pdf", "d.pdf", "e.pdf"]), results


def _ours(mark: str) -> list[str]:
    """Processes (workers, resource tracker) that carry this test's marker in their environment."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"RAGKIT_TEST_MARK={mark}".encode() in (p / "environ").read_bytes().split(b"\0"):
                    found.append(p.name)
            except OSError:
                pass
    return found


def _start_cli(tmp_path: Path, mark: str) -> subprocess.Popen:
    corpus = tmp_path / "nda"
    shutil.copytree(CORPORA, corpus)
    cmd = [sys.executable, "-m", "ragkit.cli", "ingest", str(corpus), "--store", str(tmp_path / "store"), "--workers", "2"]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "RAGKIT_TEST_MARK": mark}, start_new_session=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, bufsize=1,
                            preexec_fn=_as_a_foreground_job)


def _as_a_foreground_job() -> None:
    """Ctrl-C at its default, as a terminal gives a foreground command: a test run started
    in the background (`make test &`, `nohup`, some CI runners) ignores SIGINT, and a child
    inherits that through exec, so the CLI could not be interrupted at all (seen: exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_first_commit(proc: subprocess.Popen) -> list[str]:
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if re.match(r"^\s+added\s", line):
            return lines
    raise AssertionError(f"the child ended before its first commit: {''.join(lines)[-2000:]}")


def _gone(mark: str, within_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := _ours(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


@pytest.mark.complete
def test_ctrl_c_mid_ingest_exits_130_and_ends_the_workers(tmp_path):
    mark = uuid.uuid4().hex
    proc = _start_cli(tmp_path, mark)
    try:
        _wait_first_commit(proc)
        assert len(_ours(mark)) >= 3  # the CLI and its parse workers are running
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "interrupted: the store is consistent" in rest and "Traceback" not in rest, rest
    assert _gone(mark) == []
    settings = make_settings(tmp_path / "store")
    st = open_store(settings, load_embedder(settings), create=False)
    for r in st.documents():
        assert st.has_chunks(r.doc_id) == r.n_chunks


@pytest.mark.complete
def test_kill_9_of_the_ingest_leaves_no_worker_behind(tmp_path):
    mark = uuid.uuid4().hex
    proc = _start_cli(tmp_path, mark)
    try:
        _wait_first_commit(proc)
        assert len(_ours(mark)) >= 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _gone(mark) == []


@pytest.mark.complete
def test_a_script_without_a_main_guard_can_call_ingest(tmp_path):
    """The README's Python example as a plain script: the parse workers must not re-run it
    (multiprocessing's spawn would import the caller's __main__ in each worker)."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in ["ai-osi-stack-mutual-nda.md", "common-paper-mutual-nda-v1-standard-terms.md"]:
        shutil.copy(CORPORA / name, corpus / name)
    script = tmp_path / "script.py"
    script.write_text(
        "from pathlib import Path\n"
        "from ragkit.config import load_settings\n"
        "from ragkit.ingest import ingest\n"
        f"settings = load_settings(store=Path({str(tmp_path / 'store')!r}), ingest={{'workers': 2}})\n"
        f"r = ingest([Path({str(corpus)!r})], settings)\n"
        "print('RESULT', r.added, r.workers, r.failed)\n"
    )
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("RESULT") == 1 and "RESULT 2 2 []" in res.stdout, (res.stdout, res.stderr[-2000:])
