"""Shared fixtures. Everything here runs on the real path: the real embedder from its
PyPI package, a real Chroma store, the real default GGUF model through llama-cpp-python."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from pathlib import Path

import pytest

import ragkit  # noqa: F401  (offline switches)

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "corpora" / "nda"
# questions over the sample NDAs that the lexical index tests rank with (incremental BM25, tantivy)
NDA_QUERIES = [
    "How long does the confidentiality obligation survive termination?",
    "return or destroy confidential information",
    "which law governs this agreement",
    "injunctive relief for breach",
    "Recipient may disclose to its employees and advisors",
    "no license is granted",
    "Manitoba",
]


def _shared_corpora() -> Path:
    """The shared corpora (real documents and labelled sets written by others, not
    committed): RAGKIT_SHARED_CORPORA, else `../shared/corpora` beside the checkout, else
    this workplace's `/work/shared/corpora` (a CI clone may live elsewhere)."""
    env = os.environ.get("RAGKIT_SHARED_CORPORA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "corpora", Path("/work/shared/corpora")]:
        if cand.is_dir():
            return cand
    return ROOT.parent / "shared" / "corpora"


SHARED = _shared_corpora()

CONNECT_ATTEMPTS: list[tuple] = []


def in_ci() -> bool:
    """CI sets CI (`.ci/run` exports CI=1; hosted runners set CI=true)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# In CI a skipped test is a failed test: every test here covers a shipped feature, and
# CI installs what they need (.ci/run). A skip whose reason contains one of these
# strings is accepted; keep this empty unless a user would accept the reason too.
CI_ALLOWED_SKIPS: tuple[str, ...] = ()


def _fail_skip_in_ci(report) -> None:
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):  # an xfail is not a skip
        return
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if any(allowed in reason for allowed in CI_ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI (CI={os.environ.get('CI')!r}), which fails the run: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield  # a module that skips itself while being collected
    _fail_skip_in_ci(report)
    return report


def _is_local(address) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    host = address[0]
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_connect(self, address):
    CONNECT_ATTEMPTS.append((self.family, address))
    if not _is_local(address):
        raise OSError(f"ragkit tests: outbound connection to {address!r} blocked")
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    CONNECT_ATTEMPTS.append((self.family, address))
    if not _is_local(address):
        raise OSError(f"ragkit tests: outbound connection to {address!r} blocked")
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def no_outbound_network():
    """The whole suite runs with non-loopback connects failing, so nothing can phone home."""
    socket.socket.connect = _guarded_connect
    socket.socket.connect_ex = _guarded_connect_ex
    yield CONNECT_ATTEMPTS
    socket.socket.connect = _real_connect
    socket.socket.connect_ex = _real_connect_ex


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A private copy of the sample NDAs (tests may add or change files in their own copies)."""
    dst = tmp_path_factory.mktemp("corpus") / "nda"
    shutil.copytree(CORPORA, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def make_settings(store: Path, **generator):
    from ragkit.config import load_settings

    gen = {"n_ctx": 2048, "max_tokens": 96}
    gen.update(generator)
    return load_settings(store=store, generator=gen)


def without_label_model(settings):
    """The settings with compare.label_model "off": the checklist's words, the evidence and
    the generator decide the hypothesis items (the path of a checklist with no label model)."""
    return settings.model_copy(update={"compare": settings.compare.model_copy(update={"label_model": "off"})})


@pytest.fixture(scope="session")
def nda_store(tmp_path_factory, corpus):
    """The sample NDAs ingested once into a real Chroma store."""
    from ragkit.ingest import ingest

    store = tmp_path_factory.mktemp("store") / "ragkit"
    settings = make_settings(store)
    report = ingest([corpus], settings)
    assert report.failed == []
    assert report.added == len(list(corpus.iterdir()))
    return settings


def assert_a_changed_byte_is_refused(name: str, kind: str, tmp_path, monkeypatch, file: str = "model.onnx") -> None:
    """A copy of a model ragkit ships, installed as a package of its own with one byte of its
    `file` changed: resolving it is refused before anything loads it (exit code 3)."""
    import dataclasses

    from ragkit import models
    from ragkit.errors import ModelNotFound

    spec = models.REGISTRY[name]
    folder = models.resolve(name, kind, tmp_path / "cache")
    pkg = tmp_path / "site" / f"fake_{name.replace('-', '_')}"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copytree(folder, pkg / "model")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(models.REGISTRY, name, dataclasses.replace(spec, parts=(models.PackagedFile(pkg.name, "model", "ragkit"),)))
    onnx = pkg / "model" / file
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0x01
    onnx.write_bytes(bytes(data))
    with pytest.raises(ModelNotFound, match=f"{file} does not match its pinned sha256") as info:
        models.resolve(name, kind, tmp_path / "cache")
    assert info.value.exit_code == 3
