"""The house's rules fail when broken: the import contracts (.importlinter, run by .ci/run)
and ruff catch a violation planted in a copy of the package. The checks on the real tree run
in .ci/run before the tests; here each is shown failing on purpose, and passing on the copy
as it is. One front door per module: no module is another's alias (an entry in `sys.modules`
under a second name, or a file that only imports), and `ragkit.serve.app` exports only what it
defines. No package imports another's private (underscore) names."""

from __future__ import annotations

import ast
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


# `import ragkit` sets the offline switches first (ragkit/__init__.py: `from ragkit import _offline`)
UNDERSCORE_ALLOWED = {("__init__.py", "ragkit", "_offline")}


def _underscore_imports_across_packages(package: Path) -> list[str]:
    """Each private name (`_x`, not `__x__`) a module of `package` imports from a module of
    another package of it (ragkit.<first level>; a top-level module is a package of its own),
    as "path:line module.name"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        parts = rel.with_suffix("").parts
        mine = parts[0] if len(parts) > 1 else rel.with_suffix("").as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == package.name):
                continue
            theirs = node.module.split(".")[1] if "." in node.module else ""
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and theirs != mine and (rel.as_posix(), node.module, alias.name) not in UNDERSCORE_ALLOWED:
                    found.append(f"{rel.as_posix()}:{node.lineno} {node.module}.{alias.name}")
    return found


def test_no_package_imports_another_packages_private_names(tmp_path):
    """A name another package needs is public: `ragkit.compare` once read `_words`,
    `_quotable` and `_is_heading` of ragkit.answer.passages, the cluster `_parse_one` of
    ragkit.ingest.pipeline (now ragkit.evidence.words.words, ragkit.evidence.quotes.quotable
    and is_heading, ragkit.ingest.pipeline.parse_one)."""
    assert _underscore_imports_across_packages(ROOT / "ragkit") == []
    planted = tmp_path / "ragkit"
    (planted / "compare").mkdir(parents=True)
    (planted / "answer").mkdir()
    (planted / "__init__.py").write_text("from ragkit import _offline  # noqa\n")
    (planted / "compare" / "quotes.py").write_text("from ragkit.answer.passages import _words, clause_quote  # noqa\n"
                                                   "from ragkit.compare.report import _conf  # noqa\n")
    (planted / "answer" / "ask.py").write_text("from ragkit import _offline  # noqa\n")
    assert _underscore_imports_across_packages(planted) == ["answer/ask.py:1 ragkit._offline",
                                                            "compare/quotes.py:1 ragkit.answer.passages._words"]


# The one sys.modules write ragkit keeps: while a parse worker is spawned, `__main__` is a
# blank module for a few milliseconds, then the caller's again (ragkit/ingest/parsepool.py).
SYS_MODULES_ALLOWED = {("ingest/parsepool.py", "'__main__'")}


def _is_sys_modules(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def _sys_modules_writes(package: Path) -> list[str]:
    """Each place a module of `package` writes into `sys.modules` (an item set or deleted,
    or update/setdefault/__setitem__/pop called), as "path:line key"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and _is_sys_modules(t.value):
                    key = ast.unparse(t.slice)
                    if (rel, key) not in SYS_MODULES_ALLOWED:
                        found.append(f"{rel}:{node.lineno} {key}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_modules(node.func.value) \
                    and node.func.attr in ("update", "setdefault", "__setitem__", "pop", "__delitem__"):
                found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def _pure_aliases(package: Path) -> list[str]:
    """The modules of `package` (packages' __init__ aside, which are front doors) that define
    nothing: after the docstring only imports, `__all__` or writes into `sys.modules`."""
    def defines_nothing(stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            return True  # the docstring
        if isinstance(stmt, ast.Assign):
            return all((isinstance(t, ast.Name) and t.id == "__all__")
                       or (isinstance(t, ast.Subscript) and _is_sys_modules(t.value)) for t in stmt.targets)
        return False

    return [path.relative_to(package).as_posix() for path in sorted(package.rglob("*.py"))
            if path.name != "__init__.py" and all(map(defines_nothing, ast.parse(path.read_text(encoding="utf-8")).body))]


def test_no_module_writes_into_sys_modules_or_is_an_alias_of_another(tmp_path):
    package = ROOT / "ragkit"
    assert _sys_modules_writes(package) == []
    assert _pure_aliases(package) == []
    # what the eight alias files were (ragkit/ask.py, ragkit/embed_onnx.py...): both checks fail
    planted = tmp_path / "ragkit"
    (planted / "retrieve").mkdir(parents=True)
    (planted / "ask.py").write_text('"""Moved."""\n\nimport sys\nfrom importlib import import_module\n\n'
                                    'sys.modules[__name__] = import_module("ragkit.answer.ask")\n')
    (planted / "retrieve" / "bm25.py").write_text("from ragkit.store.lexical import *  # noqa\n")
    assert _sys_modules_writes(planted) == ["ask.py:6 __name__"]
    assert _pure_aliases(planted) == ["ask.py", "retrieve/bm25.py"]


def _top_level_definitions(path: Path) -> tuple[list[str] | None, set[str]]:
    """A module's `__all__` (None without one) and the names it binds itself (def, class,
    assignment; not imports)."""
    exported, defined = None, set()
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                defined |= names
                if names == {"__all__"}:
                    exported = list(ast.literal_eval(stmt.value))
    return exported, defined


def test_the_server_app_exports_only_what_it_defines_and_is_imported_for_nothing_else():
    """`ragkit.serve.app` re-exported 25 names of openai_api, errors and guard; each is
    imported from the module that defines it."""
    exported, defined = _top_level_definitions(ROOT / "ragkit" / "serve" / "app.py")
    assert exported is not None, "ragkit/serve/app.py has no __all__"
    assert sorted(set(exported) - defined) == [], "ragkit/serve/app.py re-exports names it does not define"
    wrong = []
    for folder in ("ragkit", "tests", "eval"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "ragkit.serve.app":
                    wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names if a.name not in exported]
    assert wrong == []
