"""Per-document sidecar files beside the store (vectors, texts, metadata of one doc_id)."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

from ragkit.store.durable import replace_durably, writing
from ragkit.store.records import Hit


class Sidecars:
    """Per-document copies of what the store holds for each `doc_id`: chunk ids, unit
    vectors, texts and metadata, one file per doc_id beside the store (or in the cache
    folder for a Chroma server store).

    A doc_id is the content hash of its file, and its chunks are written once, before its
    record is committed, so a sidecar never goes stale; it is written by `add_chunks`, from
    the very lists given to Chroma. What it buys: a query restricted to a few documents is
    a numpy dot product over their few vectors (Chroma's `where` pre-filter cost 509 ms at
    100K chunks), and texts and metadata of hits are read without a Chroma round trip
    (Chroma's `include=["documents", "metadatas"]` costs about 0.1 ms per result). A doc_id
    without a sidecar (a store written before they existed, or a document another machine
    wrote to a server) is built from Chroma, one document at a time, on first use.

    File layout (hand-written rather than `.npz`: a zip container costs a member lookup per
    array, and a hit needs only a few hundred bytes of the file): magic, header length,
    a JSON header, then the vectors (float32, n x dim), the chunk texts and the metadata
    (JSON) as UTF-8 blobs with their offsets in the header.
    """

    MAGIC = b"RKSIDE01"

    def __init__(self, folder: Path | None, cache_size: int = 4096):
        self.folder = folder
        self._headers: "OrderedDict[str, tuple]" = OrderedDict()
        self._vecs: "OrderedDict[str, tuple]" = OrderedDict()
        self.cache_size = cache_size
        self._lock = threading.Lock()

    def path(self, doc_id: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{doc_id}.side"

    def _file(self, doc_id: str) -> str:
        """`path` as a string, for the read path (a query opens a few dozen sidecars: pathlib's
        joins cost more than the reads)."""
        return os.path.join(self.folder, doc_id + ".side")

    # ---------------------------------------------------------------- writing

    def write(self, doc_id: str, ids: list[str], vectors, texts: list[str], metas: list[dict]) -> None:
        """Write (atomically) the sidecar of one doc_id; rows are ordered by chunk_index."""
        import numpy as np

        if self.folder is None:
            return
        order = sorted(range(len(ids)), key=lambda i: (int(metas[i].get("chunk_index", 0)), ids[i]))
        vec = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)[order] if ids else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(vec, axis=1, keepdims=True) if len(vec) else np.zeros((0, 1), np.float32)
        vec = vec / np.where(norms == 0, 1, norms)
        tb = [texts[i].encode() for i in order]
        mb = [json.dumps(metas[i], separators=(",", ":")).encode() for i in order]
        t_off = np.cumsum([0] + [len(b) for b in tb]).tolist()
        m_off = np.cumsum([0] + [len(b) for b in mb]).tolist()
        vbytes = vec.astype(np.float32).tobytes()
        header = {"doc_id": doc_id, "n": len(ids), "dim": int(vec.shape[1]) if len(vec) else 0,
                  "ids": [ids[i] for i in order], "text_off": t_off, "meta_off": m_off}
        hb = json.dumps(header, separators=(",", ":")).encode()
        base = 16 + len(hb)
        pad = (-base) % 64
        body = self.MAGIC + len(hb).to_bytes(8, "little") + hb + b"\0" * pad
        tmp = self.folder / f".{doc_id}.{os.getpid()}.{threading.get_ident()}.tmp"
        with writing(self.path(doc_id)):
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write(body)
                    f.write(vbytes)
                    f.write(b"".join(tb))
                    f.write(b"".join(mb))
                    f.flush()
                    os.fsync(f.fileno())
                replace_durably(tmp, self.path(doc_id))
            except OSError:
                tmp.unlink(missing_ok=True)
                raise

    def add(self, ids, embeddings, texts, metas) -> None:
        """Mirror an upsert of chunks into the sidecars of their doc_ids (merging with what
        a sidecar already holds, as Chroma's upsert does)."""
        groups: dict[str, list[int]] = {}
        for i, m in enumerate(metas):
            groups.setdefault(str(m.get("doc_id", "")), []).append(i)
        for doc_id, rows in groups.items():
            if not doc_id:
                continue
            have = self.read_all(doc_id)
            merged: dict[str, tuple] = {}
            if have is not None:
                for h, v in zip(have[0], have[1]):
                    merged[h.id] = (v, h.text, h.meta)
            for i in rows:
                merged[ids[i]] = (embeddings[i], texts[i], {k: v for k, v in metas[i].items() if v is not None})
            keys = list(merged)
            self.write(doc_id, keys, [merged[k][0] for k in keys], [merged[k][1] for k in keys], [merged[k][2] for k in keys])

    def remove(self, doc_id: str) -> None:
        if self.folder is None:
            return
        with writing(self.path(doc_id)):
            try:
                os.unlink(self.path(doc_id))
            except FileNotFoundError:
                pass
        with self._lock:
            self._headers.pop(doc_id, None)
            self._vecs.pop(doc_id, None)

    def doc_ids(self) -> set[str]:
        if self.folder is None or not self.folder.is_dir():
            return set()
        return {n[:-5] for n in os.listdir(self.folder) if n.endswith(".side") and not n.startswith(".")}

    # ---------------------------------------------------------------- reading

    def _header(self, doc_id: str):
        """(stat key, header, data offset) of a sidecar, cached while the file is unchanged;
        None when there is none."""
        if self.folder is None:
            return None
        p = self._file(doc_id)
        try:
            st = os.stat(p)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            got = self._headers.get(doc_id)
            if got is not None and got[0] == key:
                self._headers.move_to_end(doc_id)
                return got
        try:
            with open(p, "rb") as f:
                head = f.read(65536)
                if head[:8] != self.MAGIC:
                    return None
                hl = int.from_bytes(head[8:16], "little")
                if 16 + hl > len(head):
                    head += f.read(16 + hl - len(head))
            header = json.loads(head[16 : 16 + hl])
        except (OSError, ValueError):
            return None
        base = 16 + hl + ((-(16 + hl)) % 64)
        header["index"] = {cid: i for i, cid in enumerate(header["ids"])}
        got = (key, header, base)
        with self._lock:
            self._headers[doc_id] = got
            while len(self._headers) > self.cache_size:
                self._headers.popitem(last=False)
        return got

    def count(self, doc_id: str) -> int | None:
        h = self._header(doc_id)
        return None if h is None else h[1]["n"]

    def vectors(self, doc_id: str):
        """(ids, unit vectors n x dim) of one doc_id, or None."""
        import numpy as np

        h = self._header(doc_id)
        if h is None:
            return None
        key, header, base = h
        with self._lock:
            got = self._vecs.get(doc_id)
            if got is not None and got[0] == key:
                self._vecs.move_to_end(doc_id)
                return header["ids"], got[1]
        n, dim = header["n"], header["dim"]
        try:
            with open(self._file(doc_id), "rb") as f:
                f.seek(base)
                raw = f.read(n * dim * 4)
        except OSError:
            return None
        if len(raw) != n * dim * 4:
            return None
        vec = np.frombuffer(raw, dtype=np.float32).reshape(n, dim) if n else np.zeros((0, dim), np.float32)
        with self._lock:
            self._vecs[doc_id] = (key, vec)
            while len(self._vecs) > 64:
                self._vecs.popitem(last=False)
        return header["ids"], vec

    def hits(self, doc_id: str, rows: list[int] | None = None) -> list[Hit] | None:
        """Hits (text and metadata) of the given rows of one doc_id (all rows when None)."""
        h = self._header(doc_id)
        if h is None:
            return None
        return self._read_rows(doc_id, h, list(range(h[1]["n"])) if rows is None else rows)

    def hits_by_id(self, doc_id: str, chunk_ids: list[str]) -> list[Hit] | None:
        """Hits of the given chunk ids of one doc_id, in that order; None when it has no
        sidecar or the sidecar lacks one of them. One look at the file for all of them."""
        h = self._header(doc_id)
        if h is None:
            return None
        index = h[1]["index"]
        rows = [index.get(c) for c in chunk_ids]
        if None in rows:
            return None
        return self._read_rows(doc_id, h, rows)

    def _read_rows(self, doc_id: str, h, rows: list[int]) -> list[Hit] | None:
        _, header, base = h
        n, dim = header["n"], header["dim"]
        to, mo = header["text_off"], header["meta_off"]
        tbase = base + n * dim * 4
        mbase = tbase + to[-1]
        out = []
        try:
            with open(self._file(doc_id), "rb") as f:
                if len(rows) > 8:  # most of the file: one read
                    f.seek(tbase)
                    blob = f.read(to[-1] + mo[-1])
                    for r in rows:
                        out.append(Hit(id=header["ids"][r], text=blob[to[r] : to[r + 1]].decode(),
                                       meta=json.loads(blob[to[-1] + mo[r] : to[-1] + mo[r + 1]]), score=0.0))
                else:
                    fd = f.fileno()
                    for r in rows:
                        t = os.pread(fd, to[r + 1] - to[r], tbase + to[r]).decode()
                        m = json.loads(os.pread(fd, mo[r + 1] - mo[r], mbase + mo[r]))
                        out.append(Hit(id=header["ids"][r], text=t, meta=m, score=0.0))
        except (OSError, ValueError):
            return None
        return out

    def read_all(self, doc_id: str):
        """(hits, vectors) of one doc_id, or None."""
        got = self.vectors(doc_id)
        hits = self.hits(doc_id)
        if got is None or hits is None:
            return None
        return hits, got[1]


