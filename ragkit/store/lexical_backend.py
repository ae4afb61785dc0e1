"""The one place that picks the lexical index's engine (`retrieve.lexical`): "segments"
(`ragkit.store.lexical`, hand-written) or "tantivy" (`ragkit.store.lexical_tantivy`).
Both give the same surface: `open_lexical(settings, store, live_doc_ids, memo=...)` for a
reader (`memo`: a Session's dictionary, where the engine keeps what it opened) and
`refresh_lexical(settings, store)` for the writer after its commits. `settings` is read
for `store`, `store_url`, `collection`, `cache_dir` and `retrieve.lexical` only."""

from __future__ import annotations

from pathlib import Path

BACKENDS = ("segments", "tantivy")


def backend_of(settings) -> str:
    name = getattr(getattr(settings, "retrieve", None), "lexical", "segments") or "segments"
    if name not in BACKENDS:
        from ragkit.errors import ConfigError

        raise ConfigError(f"unknown retrieve.lexical {name!r}; choose from {', '.join(BACKENDS)}")
    return name


def module_for(name: str):
    if name == "tantivy":
        from ragkit.store import lexical_tantivy as mod
    else:
        from ragkit.store import lexical as mod
    return mod


def lexical_dir(settings, backend: str | None = None) -> Path:
    mod = module_for(backend or backend_of(settings))
    return mod.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)


def open_lexical(settings, store, live_doc_ids: list[str], memo: dict | None = None, backend: str | None = None):
    """The lexical index over exactly `live_doc_ids` (never a stale one)."""
    name = backend or backend_of(settings)
    return module_for(name).open_index(store, lexical_dir(settings, name), live_doc_ids, memo=memo)


def refresh_lexical(settings, store, backend: str | None = None) -> bool:
    """Bring the saved lexical index in line with the store (the writer, under its lock)."""
    name = backend or backend_of(settings)
    return module_for(name).refresh(store, lexical_dir(settings, name))
