"""Embedding engine: any OpenAI-compatible `/v1/embeddings` server (Text Embeddings
Inference, vLLM, Infinity, llama.cpp's server), for corpora bigger than one machine.

Chunks go out in batches of `embed.batch_size`, `embed.concurrency` requests at once; the
official `openai` client retries refused connections, time-outs, 429 and 5xx answers with
backoff (`embed.retries`). What comes back is checked: one vector per text, all of the
served model's dimension, finite. The store records `openai:<served model>` and that
dimension, so a store built through one served model refuses another.

Tokens are counted with the tokenizer of the local `embed.model` (MiniLM by default), and
chunks are bounded by its limit: set `embed.model` to the local copy of the served model,
or to one with the same tokenizer.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from ragkit.config import Settings
from ragkit.errors import ConfigError, RagkitError


class EmbedderError(RagkitError):
    """The embedding server answered with an error, or with vectors we cannot use."""

    exit_code = 3


class EmbedderUnreachable(EmbedderError):
    """No connection to the embedding server after every retry."""


class OpenAIEmbedder:
    variant = "openai"

    def __init__(self, settings: Settings, tokenizer_model):
        import openai

        from ragkit.openai_http import CONNECT_TIMEOUT_S, NO_API_KEY, normalize_base_url

        e = settings.embed
        self.cfg = e
        self.base_url = normalize_base_url(e.base_url or "")
        self.remote_model = e.remote_model
        self.batch_size = e.batch_size
        self._tok = tokenizer_model  # count_tokens / max_tokens of the local model
        self.max_tokens = tokenizer_model.max_tokens
        self._dim: int | None = None
        self._served: str | None = None
        self._lock = threading.Lock()
        self.requests = 0  # embeddings requests sent (retries not included), for tests and reports
        http = openai.DefaultHttpxClient(trust_env=False, follow_redirects=False)  # no proxy from the environment
        self.client = openai.OpenAI(
            base_url=self.base_url + "/v1",
            api_key=e.api_key.get_secret_value() if e.api_key else NO_API_KEY,
            max_retries=e.retries,
            timeout=openai.Timeout(e.timeout_s, connect=min(e.timeout_s, CONNECT_TIMEOUT_S)),
            http_client=http,
        )

    @classmethod
    def from_settings(cls, settings: Settings, tokenizer_class) -> "OpenAIEmbedder":
        """`tokenizer_class`: the local model class that counts tokens (ragkit.embed.local's
        SentenceTransformerEmbedder), passed in by the factory (ragkit.embed.factory), which
        alone chooses among the backends."""
        from ragkit.models import resolve

        path = resolve(settings.embed.model, "embedder", settings.cache_dir)
        if not (path.is_dir() and (path / "tokenizer.json").exists()):
            raise ConfigError(
                f"embed.model {settings.embed.model!r} has no tokenizer.json to count tokens with for backend openai",
                hint="set embed.model to a sentence-transformers folder with the served model's tokenizer (minilm)")
        return cls(settings, tokenizer_class(settings.embed.model, path))

    # ------------------------------------------------------------ identity

    def _error(self, exc: Exception, what: str) -> EmbedderError:
        import openai

        from ragkit.openai_http import connection_reason as _reason
        from ragkit.openai_http import error_detail as _detail

        where = f"the embedding server at {self.base_url}"
        if isinstance(exc, openai.APIConnectionError):
            return EmbedderUnreachable(f"cannot reach {where} ({_reason(exc)}) for {what}, after {self.cfg.retries} retries",
                                       hint="start the server, or check embed.base_url")
        if isinstance(exc, openai.APIStatusError):
            hint = "check embed.api_key" if exc.status_code in (401, 403) else (
                "check embed.remote_model" if exc.status_code in (400, 404, 422) else None)
            return EmbedderError(f"{where} answered {exc.status_code} to {what}: {_detail(exc)}", hint=hint)
        return EmbedderError(f"{where}: {what} failed: {' '.join(str(exc).split())[:200]}")

    def _model_name(self) -> str:
        if self.remote_model:
            return self.remote_model
        try:
            data = self.client.models.list().data
        except Exception as exc:
            raise self._error(exc, "GET /v1/models") from None
        ids = [m.id for m in data if getattr(m, "id", None)]
        if len(ids) != 1:
            raise ConfigError(f"the embedding server at {self.base_url} serves {len(ids)} models ({', '.join(ids) or 'none'})",
                              hint="set embed.remote_model to the one to use")
        self.remote_model = ids[0]
        return ids[0]

    def _probe(self) -> None:
        with self._lock:
            if self._dim is not None:
                return
            model = self._model_name()
            vecs, served = self._request(["dimension probe"], model, check_dim=False)
            self._dim = len(vecs[0])
            self._served = served or model

    @property
    def name(self) -> str:
        self._probe()
        return f"openai:{self._served}"

    @property
    def dim(self) -> int:
        self._probe()
        return self._dim  # type: ignore[return-value]

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self._tok.count_tokens(texts)

    # ------------------------------------------------------------ embedding

    def _request(self, batch: list[str], model: str, check_dim: bool = True) -> tuple[list[list[float]], str]:
        what = f"an embeddings request of {len(batch)} texts (model {model!r})"
        try:
            resp = self.client.embeddings.create(model=model, input=batch, encoding_format="float")
        except Exception as exc:
            raise self._error(exc, what) from None
        self.requests += 1
        data = list(resp.data or [])
        if len(data) != len(batch):
            raise EmbedderError(f"the embedding server at {self.base_url} returned {len(data)} vectors for {len(batch)} texts")
        if all(getattr(d, "index", None) is not None for d in data):
            data.sort(key=lambda d: d.index)  # the API gives each vector its input's index
        vecs = [list(d.embedding) for d in data]
        want = self._dim if check_dim else len(vecs[0])
        for v in vecs:
            if len(v) != want:
                raise EmbedderError(
                    f"the embedding server at {self.base_url} returned a {len(v)}-dim vector; "
                    f"{'the model served' if check_dim else 'its first one'} gives {want}-dim vectors",
                    hint="the server changed models? a store keeps one embedder")
            if not all(math.isfinite(x) for x in v):
                raise EmbedderError(f"the embedding server at {self.base_url} returned a vector with NaN or infinity")
        return [_normalized(v) for v in vecs], getattr(resp, "model", None) or model

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        """One vector per text, in order; up to `embed.concurrency` requests in flight;
        `progress(n)` (on this thread) as each batch of n texts comes back."""
        if not texts:
            return []
        self._probe()
        model = self.remote_model or ""
        batches = [list(range(i, min(i + self.batch_size, len(texts)))) for i in range(0, len(texts), self.batch_size)]
        out: list[list[float] | None] = [None] * len(texts)
        with ThreadPoolExecutor(max_workers=min(self.cfg.concurrency, len(batches))) as pool:
            pending = {pool.submit(self._request, [texts[i] for i in idx], model): idx for idx in batches}
            while pending:
                done, _ = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in done:
                    idx = pending.pop(fut)
                    exc = fut.exception()
                    if exc is not None:
                        for f in pending:
                            f.cancel()
                        raise exc
                    for i, v in zip(idx, fut.result()[0]):
                        out[i] = v
                    if progress is not None:
                        progress(len(idx))
        return out  # type: ignore[return-value]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


def _normalized(v: list[float]) -> list[float]:
    """Unit length, as the local embedders give (servers differ on whether they normalize)."""
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v] if n > 0 else v
