"""`openai`: an engine's rerank route (`POST {base}/v1/rerank`, the Jina / Cohere shape that
llama-server, vLLM, TEI and Infinity serve): `retrieve.rerank_base_url`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragkit.errors import ConfigError
from ragkit.rerankers.base import RerankerError

if TYPE_CHECKING:
    from ragkit.config import Settings


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

    @classmethod
    def from_settings(cls, settings: "Settings") -> "OpenAIReranker":
        rs = settings.retrieve
        if not rs.rerank_base_url:
            raise ConfigError("retrieve.rerank 'openai' needs retrieve.rerank_base_url (e.g. http://127.0.0.1:8012/v1)")
        k = rs.rerank_api_key  # a SecretStr; a plain str when set by model_copy (not validated)
        secret = (k.get_secret_value() if hasattr(k, "get_secret_value") else str(k)) if k else ""
        return cls(rs.rerank_base_url, api_key=secret or None, model=rs.rerank_remote_model, timeout_s=rs.rerank_timeout_s)

