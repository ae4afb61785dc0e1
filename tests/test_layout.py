"""The house's rules fail when broken: the import contracts (.importlinter, run by .ci/run)
and ruff catch a violation planted in a copy of the package. The checks on the real tree run
in .ci/run before the tests; here each is shown failing on purpose, and passing on the copy
as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BIN = Path(sys.executable).parent


@pytest.fixture()
def tree(tmp_path):
    """A copy of the package and the contracts, checked where they are."""
    shutil.copytree(ROOT / "ragkit", tmp_path / "ragkit", ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint_imports(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=where, capture_output=True, text=True,
                          env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_the_import_contracts_hold_and_fail_on_an_import_against_the_layout(tree):
    ok = _lint_imports(tree)
    assert ok.returncode == 0, ok.stdout[-2000:]
    assert "0 broken" in ok.stdout
    # retrieval reaching up into answers, and the store into retrieval: two contracts broken
    (tree / "ragkit" / "retrieve" / "_planted.py").write_text("from ragkit.answer.claims import attribute  # noqa\n")
    (tree / "ragkit" / "store" / "_planted.py").write_text("from ragkit.retrieve import retrieve  # noqa\n")
    bad = _lint_imports(tree)
    assert bad.returncode != 0
    assert "Retrieval ends at the prompt: it never imports answers or the comparison BROKEN" in bad.stdout
    assert "The store and ingest never import retrieval or answers BROKEN" in bad.stdout
    assert "ragkit.retrieve._planted -> ragkit.answer.claims" in bad.stdout


def test_ruff_fails_on_an_unused_name_and_on_unsorted_imports(tree):
    def ruff(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ruff"), "check", "--no-cache", str(path)], cwd=tree, capture_output=True,
                              text=True, timeout=120)

    assert ruff(tree / "ragkit").returncode == 0
    planted = tree / "ragkit" / "_planted.py"
    planted.write_text("import sys\nimport os\n\nprint(os.sep)\n")
    out = ruff(planted)
    assert out.returncode == 1 and "F401" in out.stdout and "I001" in out.stdout
