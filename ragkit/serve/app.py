"""The HTTP app of `ragkit serve`: `create_app(settings)` wires the parts together.

- `ragkit.serve.openai_api`: the OpenAI-compatible API (`GET /health`, `GET /v1/models`,
  `GET /v1/models/{id}`, `POST /v1/chat/completions`, streaming or not), as a router;
- `ragkit.serve.web`: the web page and its API, when installed (`web.register(app)`);
- `ragkit.serve.guard.Guard`: one ASGI guard in front of every route: Host and Origin
  checks (DNS rebinding, cross-site requests), the bearer token (everything but GET
  /health), and the request body limit;
- `ragkit.serve.errors`: every error OpenAI-shaped, {"error": {"message", "type", "param", "code"}}.

The app holds no pipeline logic: a request becomes one `ragkit.answer.ask.ask` call on the
loaded generator, in a worker thread, one at a time (`ServeState.run_generation`).
It exports `create_app` alone: each other name is imported from the module that defines it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from ragkit.config import Settings
from ragkit.serve.errors import install_error_handlers
from ragkit.serve.guard import Guard, is_loopback_host
from ragkit.serve.openai_api import router
from ragkit.serve.server_state import ServeState

__all__ = ["create_app"]


def create_app(settings: Settings, *, token: str | None = None, max_queue: int = 4, preload: bool = True,
               host: str | None = None) -> FastAPI:
    """The ragkit HTTP app. `token`: required bearer token (default: `serve.token` of the
    settings; None there too: no token). `max_queue`: requests that may wait for the
    generator (more get 429). `preload`: load the embedder and generator now (errors
    raise: ModelNotFound...); otherwise on the first request (errors answer 503).
    `host`: the address the server binds (default `serve.host`); on loopback, requests
    must name a loopback Host."""
    if token is None and settings.serve.token is not None:
        token = settings.serve.token.get_secret_value()
    token = token or None
    state = ServeState(settings, token=token, max_queue=max_queue)
    if preload:
        state.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state.cancel_all()

    app = FastAPI(title="ragkit", version=_version(), docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="Offline document question answering with citations, OpenAI-compatible.")
    app.state.ragkit = state
    bind = host if host is not None else settings.serve.host
    from ragkit.serve.web import UPLOAD_PATH, upload_limit_of, upload_request_cap

    app.add_middleware(Guard, token=token, loopback_only=is_loopback_host(bind),
                       api_limit=settings.serve.max_body_bytes, other_limit=(settings.serve.max_upload_mb + 1) * 1024 * 1024,
                       route_limits={UPLOAD_PATH: upload_request_cap(upload_limit_of(settings))})
    install_error_handlers(app)
    app.include_router(router)  # the routes read `state` from request.app.state.ragkit
    try:
        from ragkit.serve import web
    except ImportError as exc:
        if exc.name != "ragkit.serve.web":
            raise
    else:
        web.register(app)
    return app


def _version() -> str:
    from ragkit import __version__

    return __version__
