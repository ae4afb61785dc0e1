"""ragkit on a Ray cluster: files parsed and chunked in Ray tasks, embedded by Ray actors,
written by this process (the driver) through the pipeline's own writer, cache and commit rule.

A room above the pipeline: it imports ragkit.ingest and the store, never the reverse. Ray is
imported inside functions only (`ragkit --help` never pays for it)."""

from __future__ import annotations


def ingest_on_cluster(paths, settings, address=None, **kwargs):
    """See ragkit.cluster.ingest.ingest_on_cluster."""
    from ragkit.cluster.ingest import ingest_on_cluster as run

    return run(paths, settings, address, **kwargs)


__all__ = ["ingest_on_cluster"]
