"""Retrieval: search the store, rank the sources, pack the prompt. One call: `retrieve`."""

from ragkit.retrieve.pipeline import Retrieval, retrieve

__all__ = ["Retrieval", "retrieve"]
