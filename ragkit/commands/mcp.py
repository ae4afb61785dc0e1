"""`ragkit mcp`: the documents as a Model Context Protocol server (stdio, or --http)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ragkit.commands._common import JsonOpt, ProfileOpt, StoreOpt, err, fail, settings_for
from ragkit.errors import RagkitError, UsageError


def register(app: typer.Typer) -> None:
    @app.command()
    def mcp(
        store: Optional[Path] = StoreOpt,
        profile: Optional[str] = ProfileOpt,
        http: bool = typer.Option(False, "--http", help="serve streamable HTTP (at /mcp) instead of stdio"),
        host: Optional[str] = typer.Option(None, "--host", help="with --http: address to bind (default 127.0.0.1; anything else needs a token)"),
        port: Optional[int] = typer.Option(None, "--port", help="with --http: port (default 8765; 0 picks a free one)"),
        token: Optional[str] = typer.Option(
            None, "--token", help="with --http: require `Authorization: Bearer TOKEN` on every route but /health "
            "(better: RAGKIT_SERVE__TOKEN, which `ps` does not show)"),
        as_json: bool = JsonOpt,
    ) -> None:
        """Serve the documents to desktop assistants and agents over MCP: tools documents, search, ask, compare."""
        from ragkit.commands.serve import bind_socket, check_bind

        try:
            settings = settings_for(store, profile)
            sock = None
            host_ = token_ = None
            if http:
                sv = settings.serve
                host_ = host if host is not None else sv.host
                port_ = port if port is not None else _default_port()
                token_ = token if token is not None else (sv.token.get_secret_value() if sv.token is not None else None)
                if not 0 <= port_ <= 65535:
                    raise UsageError(f"--port {port_} is not a port number")
                check_bind(host_, token_)  # before any model loads
                sock = bind_socket(host_, port_)
            else:
                given = [o for o, v in (("--host", host), ("--port", port), ("--token", token)) if v is not None]
                if given:
                    raise UsageError(f"{', '.join(given)} {'go' if len(given) > 1 else 'goes'} with --http "
                                     "(stdio has no address)")
            err.print(f"ragkit mcp: loading {settings.generator.model} and {settings.embed.model}...", highlight=False)
            from ragkit.serve.mcp import build_server
            from ragkit.serve.mcp_tools import RagkitTools
            from ragkit.serve.server_state import ServeState

            state = ServeState(settings, token=token_)
            if not state.has_store():
                err.print(f"[yellow]warning:[/] no store at {settings.store} yet: ingest documents first "
                          "(`ragkit ingest PATH`); the tools answer with an error until then", highlight=False)
            n_docs = len(state.documents())  # an unreadable store: exit 4 now, not an error per call
            state.load()
            server = build_server(RagkitTools(state))
        except RagkitError as exc:
            if sock is not None:
                sock.close()
            fail(exc, as_json)
            return
        try:
            if http:
                _serve_http(server, state, sock, host_, token_, n_docs, as_json)
            else:
                import anyio

                err.print(f"ragkit mcp: serving {n_docs} documents over stdio ({state.generator_name})", highlight=False)
                anyio.run(server.run_stdio_async)
        except KeyboardInterrupt:
            raise typer.Exit(130)
        finally:
            state.cancel_all()
            from ragkit.serve.web import RENDERER

            RENDERER.close()
        if not http:
            # The client closed stdin: it gives the server 2 s to exit before SIGTERM (the
            # spec's stdio shutdown; the SDK's PROCESS_TERMINATION_TIMEOUT). Freeing the
            # models at interpreter exit takes most of that on a busy machine, and nothing
            # here is left to write (the server never writes the store): exit now.
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _default_port() -> int:
    from ragkit.serve.mcp import DEFAULT_HTTP_PORT

    return DEFAULT_HTTP_PORT


def _serve_http(server, state, sock, host: str, token: str | None, n_docs: int, as_json: bool) -> None:
    import uvicorn

    from ragkit.commands.serve import log_config, url_of
    from ragkit.serve.mcp import MCP_PATH, http_app

    app_ = http_app(server, state, host=host, token=token)
    bound_port = sock.getsockname()[1]
    url = url_of(host, bound_port)

    def ready() -> None:
        info = {"url": url, "mcp_url": url + MCP_PATH, "host": host, "port": bound_port, "documents": n_docs,
                "generator": state.generator_name, "token_required": bool(token), "transport": "streamable-http"}
        if as_json:
            sys.stdout.write(json.dumps(info) + "\n")
            sys.stdout.flush()
        else:
            err.print(f"ragkit mcp: {url}{MCP_PATH} (streamable HTTP), {n_docs} documents, {state.generator_name}, "
                      f"token {'required' if token else 'not required (loopback only)'}; Ctrl-C stops", highlight=False)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if not self.should_exit:
                ready()

    # loop="asyncio", not uvloop: libuv's io_uring socket operations are no system calls an
    # OS-level trace (tests/test_network.py) can see
    config = uvicorn.Config(app_, log_config=log_config(), log_level="info", server_header=False,
                            timeout_graceful_shutdown=5, lifespan="on", loop="asyncio")
    try:
        Server(config).run(sockets=[sock])
    finally:
        sock.close()
