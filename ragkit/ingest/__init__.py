"""Ingest: files -> blocks -> sections -> token-bounded chunks -> embeddings -> store."""

from ragkit.ingest.pipeline import IngestReport, ingest

__all__ = ["IngestReport", "ingest"]
