"""A real `ragkit serve` for tests: a subprocess on a free loopback port.

    from serve_fixture import running_server
    with running_server(store_dir, token="t0ken") as srv:
        client = srv.client()                 # openai.OpenAI at srv.base_url
        httpx.get(srv.url + "/health")

The server runs the real default model with a small context and answer (n_ctx 2048,
max_tokens 96, unless `env` says otherwise), its stdout and stderr go to files
(`srv.log()` reads them), and it is stopped at the end of the block.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
_EXE = Path(sys.executable).parent / "ragkit"
RAGKIT = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "ragkit.cli"]
START_TIMEOUT_S = 120.0
SMALL = {"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "96"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerInfo:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen
    token: str | None
    out_path: Path = field(default=None)  # stdout (the --json ready line)
    err_path: Path = field(default=None)  # stderr (uvicorn and ragkit log lines)
    ready: dict = field(default_factory=dict)  # the JSON line `ragkit serve --json` printed

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, *, api_key: str | None = None, timeout: float = 180.0, max_retries: int = 0, **kw):
        """The official OpenAI client pointed at this server (the token as the API key)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=api_key or self.token or "unused",
                             timeout=timeout, max_retries=max_retries, **kw)

    def health(self, timeout: float = 10.0) -> dict:
        return httpx.get(self.url + "/health", timeout=timeout, trust_env=False).json()

    def wait_idle(self, timeout: float = 120.0) -> dict:
        """Wait until no generation runs or waits; the last /health."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if not h["busy"] and not h.get("queued"):
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"the server stayed busy for {timeout:.0f} s: {h}\n{self.log()}")
            time.sleep(0.1)

    def log(self, tail: int = 6000) -> str:
        out = self.out_path.read_text(errors="replace") if self.out_path and self.out_path.exists() else ""
        err = self.err_path.read_text(errors="replace") if self.err_path and self.err_path.exists() else ""
        return f"--- stdout\n{out[-tail:]}\n--- stderr\n{err[-tail:]}"


def _stop(proc: subprocess.Popen, timeout: float = 20.0, *, wrapped: bool = False) -> None:
    """SIGTERM the server (`wrapped`: the processes under a wrapper such as strace, which
    keeps recording), then kill. An unwrapped server gets the signal itself: the children it
    started (a page renderer's, multiprocessing's resource tracker) are not the server, and
    signalling only them left it running until the kill, 20 s later."""
    if proc.poll() is not None:
        return
    children = []
    if wrapped:
        try:
            import psutil

            children = psutil.Process(proc.pid).children(recursive=True)
        except Exception:
            children = []
    targets = children
    for c in targets:
        try:
            c.send_signal(signal.SIGTERM)
        except Exception:
            pass
    if not targets:
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        for c in targets:
            try:
                c.kill()
            except Exception:
                pass
        proc.kill()
        proc.wait(10)


@contextmanager
def running_server(store: Path, *, token: str | None = None, env: dict[str, str] | None = None,
                   extra_args: Sequence[str] = (), prefix: Sequence[str] = (), log_dir: Path | None = None,
                   timeout: float = START_TIMEOUT_S) -> Iterator[ServerInfo]:
    """Start `ragkit serve --store STORE` on a free 127.0.0.1 port (`--token TOKEN` when
    given; `extra_args` are appended, `prefix` goes before the command, e.g. strace), wait
    for GET /health (failing with the server's log after `timeout` s), yield a ServerInfo,
    and stop the server at the end."""
    port = free_port()
    cmd = [*prefix, *RAGKIT, "serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port), "--json"]
    if token is not None:
        cmd += ["--token", token]
    cmd += list(extra_args)
    full_env = {**os.environ, **SMALL, "PYTHONUNBUFFERED": "1"}
    full_env.update(env or {})
    folder = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="ragkit-serve-"))
    folder.mkdir(parents=True, exist_ok=True)
    out_path, err_path = folder / f"serve-{port}.out", folder / f"serve-{port}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env=full_env)
    info = ServerInfo(url=f"http://127.0.0.1:{port}", proc=proc, token=token, out_path=out_path, err_path=err_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ragkit serve exited with {proc.returncode} before answering /health:\n{info.log()}")
            try:
                r = httpx.get(info.url + "/health", timeout=2, trust_env=False)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ragkit serve did not answer /health within {timeout:.0f} s:\n{info.log()}")
            time.sleep(0.25)
        lines = [x for x in out_path.read_text(errors="replace").splitlines() if x.strip().startswith("{")]
        if lines:
            info.ready = json.loads(lines[-1])
        yield info
    finally:
        _stop(proc, wrapped=bool(prefix))
