"""store_url: ingest, list and retrieve against a real `chroma run` server on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import CORPORA, make_settings

CHROMA = Path(sys.executable).parent / "chroma"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory):
    if not CHROMA.exists():
        pytest.skip("the chroma CLI is not installed in this environment")
    data = tmp_path_factory.mktemp("chroma-server")
    port = _free_port()
    env = dict(os.environ, ANONYMIZED_TELEMETRY="False", CHROMA_TELEMETRY_DISABLED="1")
    log = open(data / "server.log", "wb")
    proc = subprocess.Popen(
        [str(CHROMA), "run", "--path", str(data / "db"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    up = False
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as r:
                up = r.status == 200
                break
        except OSError:
            time.sleep(0.3)
    if not up:
        proc.kill()
        proc.wait(10)
        log.close()
        pytest.fail(f"chroma server did not come up in 60 s: {(data / 'server.log').read_text()[-2000:]}")
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    log.close()


def test_ingest_list_retrieve_reingest_on_a_chroma_server(chroma_server, tmp_path, no_outbound_network):
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.retrieve import retrieve
    from ragkit.store import open_store

    docs = tmp_path / "nda"
    docs.mkdir()
    for name in ("bonterms-mutual-nda-v1.pdf", "cnli_dev_019.pdf"):
        shutil.copy(CORPORA / name, docs / name)
    settings = make_settings(tmp_path / "unused-local-store").model_copy(update={"store_url": chroma_server, "cache_dir": tmp_path / "cache"})
    before = len(no_outbound_network)

    report = ingest([docs], settings)
    assert report.failed == [] and report.added == 2 and report.chunks > 0
    assert not (tmp_path / "unused-local-store" / "chroma").exists(), "server mode wrote an embedded store"

    store = open_store(settings, load_embedder(settings), create=False)
    names = [d.name for d in store.documents()]
    assert names == ["bonterms-mutual-nda-v1.pdf", "cnli_dev_019.pdf"]
    assert store.count() == report.chunks

    prompt = retrieve("Which law governs this agreement?", settings, docs=["bonterms-mutual-nda-v1.pdf"]).prompt
    assert prompt.contexts and {c.doc for c in prompt.contexts} == {"bonterms-mutual-nda-v1.pdf"}
    assert any("governed by" in c.text.lower() or "governing law" in c.text.lower() for c in prompt.contexts)

    again = ingest([docs], settings)
    assert (again.added, again.updated, again.unchanged, again.chunks) == (0, 0, 2, 0)

    # every connection went to the loopback server
    for family, address in no_outbound_network[before:]:
        if isinstance(address, tuple):
            assert address[0] in ("127.0.0.1", "::1", "localhost"), address


def test_a_server_that_is_not_there_is_a_clear_store_error(tmp_path):
    from ragkit.errors import StoreError
    from ragkit.ingest import ingest

    settings = make_settings(tmp_path / "s").model_copy(update={"store_url": f"http://127.0.0.1:{_free_port()}", "cache_dir": tmp_path / "cache"})
    with pytest.raises(StoreError) as info:
        ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    msg = str(info.value)
    assert "cannot open the Chroma store at http://127.0.0.1:" in msg and "\n" not in msg


def test_a_writer_that_lost_its_lease_stops_before_its_next_write(chroma_server, tmp_path):
    """Store item 2: a writer paused past its lease (here: its renewals stopped and the lease
    run out) must not renew over the writer that took the lease, and must stop (exit 5)
    before its next write instead of writing beside it."""
    import time as _time

    from ragkit.errors import StoreLocked
    from ragkit.store import ChromaStore, ServerLease

    client = ChromaStore.connect(chroma_server)
    a = ServerLease(client, "paused", lease_s=1.2).__enter__()
    a._stop.set()  # the pause: no renewal runs
    a._thread.join(5)
    a.check()  # still within its lease: may write
    _time.sleep(1.4)  # past the lease
    b = ServerLease(client, "paused", lease_s=60, wait_s=5).__enter__()  # takes the expired lease
    try:
        assert b._holder()["owner"] == b.owner
        assert a.renew_once() is False  # the paused writer wakes up: it does not renew over b
        assert b._holder()["owner"] == b.owner and a.lost
        with pytest.raises(StoreLocked) as info:
            a.check()
        assert info.value.exit_code == 5 and "stopped writing" in str(info.value)
        a.__exit__(None, None, None)  # leaving does not delete the new holder's record
        assert b._holder()["owner"] == b.owner
        b.check()
        assert b.renew_once() is True
        # the store's own writes ask first: a store guarded by the lost lease writes nothing
        settings = make_settings(tmp_path / "unused").model_copy(
            update={"store_url": chroma_server, "collection": "paused-store", "cache_dir": tmp_path / "cache"})
        from ragkit.embed import load_embedder
        from ragkit.store import open_store

        st = open_store(settings, load_embedder(settings), create=True)
        st.guard = a.check
        with pytest.raises(StoreLocked):
            st.add_chunks(["x:0"], [[0.1] * st.col.metadata["dim"]], ["text"], [{"doc_id": "x", "chunk_index": 0}])
        assert st.count() == 0
    finally:
        b.__exit__(None, None, None)


class _SkewedClock:
    """The `time` module of a machine whose wall clock is `skew` seconds off (its monotonic
    clock has no date to be wrong about)."""

    def __init__(self, skew: float):
        self.skew = skew

    def time(self) -> float:
        return time.time() + self.skew

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_lease_does_not_depend_on_the_writers_clocks_agreeing(chroma_server, monkeypatch):
    """Two machines whose clocks are 10 minutes apart agree on a lease: a live lease taken
    by a machine whose clock runs behind is not taken as run out, and the lease of a crashed
    machine whose clock runs ahead is taken over once it has run out, not 10 minutes later.
    (Each machine is this process with ragkit.store.locks reading a skewed clock.)"""
    from ragkit.errors import StoreLocked
    from ragkit.store import ChromaStore, ServerLease, locks

    client = ChromaStore.connect(chroma_server)
    monkeypatch.setattr(locks, "time", _SkewedClock(-600))  # machine A: 10 minutes behind
    behind = ServerLease(client, "skewed-behind", lease_s=60).__enter__()
    monkeypatch.setattr(locks, "time", time)  # machine B: the right time
    try:
        with pytest.raises(StoreLocked):
            ServerLease(client, "skewed-behind", lease_s=60).__enter__()
        assert behind._holder()["owner"] == behind.owner
        behind.check()
    finally:
        behind.__exit__(None, None, None)

    monkeypatch.setattr(locks, "time", _SkewedClock(+600))  # machine A: 10 minutes ahead, then it crashes
    ahead = ServerLease(client, "skewed-ahead", lease_s=1.5).__enter__()
    ahead._stop.set()
    ahead._thread.join(5)
    monkeypatch.setattr(locks, "time", time)
    t0 = time.monotonic()
    b = ServerLease(client, "skewed-ahead", lease_s=60, wait_s=8).__enter__()
    try:
        waited = time.monotonic() - t0
        assert b._holder()["owner"] == b.owner
        assert waited >= 1.0  # not before the crashed writer's lease ran out
    finally:
        b.__exit__(None, None, None)


def test_one_writer_per_server_collection_across_machines(chroma_server, tmp_path):
    """Two machines writing one server: their local lock files differ (each machine has its
    own cache folder), so only the lease that lives in the server can refuse the second."""
    import time as _time

    from ragkit.errors import StoreLocked
    from ragkit.ingest import ingest
    from ragkit.store import ChromaStore, ServerLease, StoreWriter

    base = make_settings(tmp_path / "unused").model_copy(update={"store_url": chroma_server, "collection": "leased"})
    machine_a = base.model_copy(update={"cache_dir": tmp_path / "machine-a"})
    machine_b = base.model_copy(update={"cache_dir": tmp_path / "machine-b"})
    with StoreWriter(machine_a):
        with pytest.raises(StoreLocked) as info:
            with StoreWriter(machine_b):
                pass
        assert info.value.exit_code == 5 and "host" in str(info.value)
        # the real job on machine B is refused too, and says so
        with pytest.raises(StoreLocked):
            ingest([CORPORA / "cnli_dev_019.pdf"], machine_b)
    # released: machine B now writes
    with StoreWriter(machine_b):
        pass
    # a writer that crashed leaves a lease that expires; the next writer takes it over
    client = ChromaStore.connect(chroma_server)
    crashed = ServerLease(client, "leased", lease_s=60)
    crashed.col.add(ids=[ServerLease.RECORD], embeddings=[[0.0]],
                    metadatas=[{**crashed.info, "expires": _time.time() - 1}])
    with StoreWriter(machine_a) as w:
        assert w.lease is not None and w.lease._holder()["owner"] == w.lease.owner
    # a live lease held by a crashed writer is not stolen before it expires
    crashed.col.add(ids=[ServerLease.RECORD], embeddings=[[0.0]],
                    metadatas=[{**crashed.info, "expires": _time.time() + 60}])
    with pytest.raises(StoreLocked):
        with StoreWriter(machine_a, wait_s=1.0):
            pass
