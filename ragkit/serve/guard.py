"""The guard in front of every route of `ragkit serve` (and of `ragkit mcp --http`):
Host and Origin checks (DNS rebinding, cross-site requests), the bearer token
(everything but GET /health and the web page's shell), and the request body limits.
"""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from ragkit.serve.errors import ApiError, BodyTooLarge


def is_loopback_host(host: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 (no name lookup: any other name is not loopback)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The host part of a Host header value ("127.0.0.1:8000", "[::1]:8000", "localhost")."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


def _public_paths() -> frozenset[str]:
    try:
        from ragkit.serve.web import PUBLIC_PATHS
    except ImportError:  # the web page is optional
        return frozenset()
    return PUBLIC_PATHS


class Guard:
    """ASGI middleware in front of every route (routes added later included):

    1. Host: when the server binds loopback, the Host header must name loopback, so a
       web page cannot reach it by DNS rebinding (an attacker's name resolving to 127.0.0.1).
    2. Origin: a browser request from another origin is refused (no cross-site POSTs or
       uploads; no CORS headers are ever sent, so no page can read answers either).
    3. Token: with one, every request but GET /health needs `Authorization: Bearer TOKEN`
       (compared with hmac.compare_digest).
    4. Body size: over `api_limit` bytes on /v1/ routes, `other_limit` elsewhere, and a
       route's own limit where it has one (`route_limits`: the upload route): 413.
    """

    def __init__(self, app, *, token: str | None, loopback_only: bool, api_limit: int, other_limit: int,
                 route_limits: dict[str, int] | None = None):
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.loopback_only = loopback_only
        self.api_limit = api_limit
        self.other_limit = other_limit
        self.route_limits = dict(route_limits or {})  # a route with its own (larger) limit: uploads

    def limit_for(self, path: str) -> int:
        if path in self.route_limits:
            return self.route_limits[path]
        return self.api_limit if path.startswith("/v1/") else self.other_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = self.check(scope)
        if refused is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await refused.response()(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)

    def check(self, scope) -> ApiError | None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.lower(), v)
        host = headers.get(b"host", b"").decode("latin-1")
        if self.loopback_only and not is_loopback_host(_host_name(host) or "localhost"):
            return ApiError(400, f"Host {host!r} is not this server's loopback address (refused: DNS rebinding guard)",
                            code="invalid_host")
        origin = headers.get(b"origin")
        if origin is not None:
            o = origin.decode("latin-1").strip()
            parts = urlsplit(o)
            if o == "null" or parts.netloc.lower() != host.lower() or parts.scheme not in ("http", "https"):
                return ApiError(403, f"cross-origin request from {o!r} refused", code="cross_origin")
        # No token for GET /health, nor for the page's own shell (`/` and its three static
        # files, ragkit.serve.web.PUBLIC_PATHS): a browser navigation cannot send a header,
        # and they hold no document data; every route that does (documents, pages,
        # uploads, answers) still needs the token, which the page sends on each fetch.
        public = scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and (
            scope.get("path") == "/health" or scope.get("path") in _public_paths())
        if self.token is not None and not public:
            auth = headers.get(b"authorization", b"")
            scheme, _, cred = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(cred.strip(), self.token):
                return ApiError(401, "a valid token is required: send `Authorization: Bearer TOKEN`" if not auth
                                else "invalid token", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        if scope["type"] == "http":
            cl = headers.get(b"content-length")
            if cl is not None:
                try:
                    size = int(cl)
                except ValueError:
                    return ApiError(400, "invalid Content-Length", code="invalid_request")
                limit = self.limit_for(scope["path"])
                if size > limit:
                    return ApiError(413, f"the request body of {size} bytes is over the limit of {limit} bytes",
                                    code="request_too_large")
        return None
