"""Find candidate sections for a question."""

from __future__ import annotations

from pathlib import Path

from ragkit.errors import UsageError
from ragkit.store import DocRecord, Hit


def resolve_docs(records: list[DocRecord], wanted: list[str]) -> list[DocRecord]:
    """Match each --doc (a path, a file name, or a name without extension) to one document."""
    if not wanted:
        return records
    out: list[DocRecord] = []
    for w in wanted:
        wp = str(Path(w).expanduser().resolve()) if ("/" in w or Path(w).exists()) else None
        matches = [r for r in records if wp and r.key == wp]
        if not matches:
            wl = w.lower()
            matches = [r for r in records if r.name.lower() == wl]
        if not matches:
            matches = [r for r in records if Path(r.name).stem.lower() == Path(w).stem.lower() and Path(w).suffix == ""]
        if not matches:
            names = ", ".join(sorted({r.name for r in records})[:12]) or "(the store is empty)"
            raise UsageError(f"no ingested document matches --doc {w!r}", hint=f"ingested: {names}")
        if len(matches) > 1:
            raise UsageError(
                f"--doc {w!r} matches {len(matches)} documents ({', '.join(m.key for m in matches[:4])})",
                hint="give the full path",
            )
        if matches[0] not in out:
            out.append(matches[0])
    return out


def dense_search(store, query_vec: list[float], docs: list[DocRecord], k: int, *, per_doc: bool = False) -> list[Hit]:
    """Top-k sections by embedding similarity. With several documents named, each one is
    searched on its own and the results interleaved by rank, so every named document is
    represented in the candidates."""
    doc_ids = sorted({d.doc_id for d in docs})
    if len(doc_ids) <= 1 or not per_doc:
        return store.query(query_vec, k, doc_ids)
    per = max(2, -(-k // len(doc_ids)))
    lists = [store.query(query_vec, per, [d]) for d in doc_ids]
    out: list[Hit] = []
    for rank in range(per):
        for lst in lists:
            if rank < len(lst):
                out.append(lst[rank])
    return out
