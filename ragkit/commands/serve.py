"""`ragkit serve`: the OpenAI-compatible HTTP server (one process, models loaded once)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Optional

import typer

from ragkit.commands._common import JsonOpt, ProfileOpt, StoreOpt, err, fail, settings_for
from ragkit.errors import RagkitError, UsageError


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on anything but loopback without a token (UsageError, exit 2)."""
    from ragkit.serve.guard import is_loopback_host

    if token is not None and not token.strip():
        raise UsageError("the token is empty", hint="pass --token TOKEN or set RAGKIT_SERVE__TOKEN")
    if not is_loopback_host(host) and not token:
        raise UsageError(
            f"refusing to serve on {host}, which is not a loopback address, without a token: anyone who can reach "
            "it could read the documents",
            hint="pass --token TOKEN (or set RAGKIT_SERVE__TOKEN / serve.token), or bind 127.0.0.1",
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or UsageError."""
    import ipaddress

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host.strip("[]")).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a name ("localhost"): resolved by bind, locally
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="pick another --port, or stop what holds this one") from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int) -> str:
    h = host.strip("[]")
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def log_config() -> dict:
    """uvicorn's logging, all of it on stderr (stdout carries the --json line only)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    for h in cfg["handlers"].values():
        h["stream"] = "ext://sys.stderr"
    cfg["loggers"]["ragkit.serve"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return cfg


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        store: Optional[Path] = StoreOpt,
        host: Optional[str] = typer.Option(None, "--host", help="address to bind (default 127.0.0.1; anything else needs a token)"),
        port: Optional[int] = typer.Option(None, "--port", help="port (default 8000; 0 picks a free one)"),
        token: Optional[str] = typer.Option(
            None, "--token", help="require `Authorization: Bearer TOKEN` on every route but /health "
            "(better: RAGKIT_SERVE__TOKEN, which `ps` does not show)"),
        max_queue: Optional[int] = typer.Option(None, "--max-queue", help="requests that may wait for the generator (default 4); more get 429"),
        profile: Optional[str] = ProfileOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Serve the documents over an OpenAI-compatible API (/v1/chat/completions, /v1/models)."""
        try:
            settings = settings_for(store, profile)
            sv = settings.serve
            host_ = host if host is not None else sv.host
            port_ = port if port is not None else sv.port
            token_ = token if token is not None else (sv.token.get_secret_value() if sv.token is not None else None)
            queue = max_queue if max_queue is not None else sv.max_queue
            if queue < 0:
                raise UsageError("--max-queue must be 0 or more")
            if not 0 <= port_ <= 65535:
                raise UsageError(f"--port {port_} is not a port number")
            check_bind(host_, token_)
            sock = bind_socket(host_, port_)
            if not as_json:
                err.print(f"loading {settings.generator.model} and {settings.embed.model}...", highlight=False)
            from ragkit.serve.app import create_app

            app_ = create_app(settings, token=token_, max_queue=queue, host=host_)
            state = app_.state.ragkit
            if not state.has_store():
                err.print(f"[yellow]warning:[/] no store at {settings.store} yet: ingest documents first "
                          "(`ragkit ingest PATH`); questions answer 503 until then", highlight=False)
            n_docs = len(state.documents())  # an unreadable store: exit 4 now, not 503 later
        except RagkitError as exc:
            fail(exc, as_json)
            return
        bound_port = sock.getsockname()[1]
        url = url_of(host_, bound_port)

        def ready() -> None:
            info = {"url": url, "base_url": url + "/v1", "host": host_, "port": bound_port, "documents": n_docs,
                    "generator": state.generator_name, "token_required": bool(token_), "max_queue": queue}
            if as_json:
                sys.stdout.write(json.dumps(info) + "\n")
                sys.stdout.flush()
            else:
                err.print(f"ragkit serve: {url} (OpenAI base URL {url}/v1), {n_docs} documents, "
                          f"{state.generator_name}, token {'required' if token_ else 'not required (loopback only)'}; "
                          "Ctrl-C stops", highlight=False)

        import uvicorn

        class Server(uvicorn.Server):
            async def startup(self, sockets=None):
                await super().startup(sockets=sockets)
                if not self.should_exit:
                    ready()

        # loop="asyncio", not uvloop: libuv submits work through io_uring, whose socket
        # operations are no system calls an OS-level trace (tests/test_network.py) can see
        config = uvicorn.Config(app_, log_config=log_config(), log_level="info", server_header=False,
                                timeout_graceful_shutdown=5, lifespan="on", loop="asyncio")
        server = Server(config)
        try:
            server.run(sockets=[sock])
        finally:
            state.cancel_all()
            sock.close()
