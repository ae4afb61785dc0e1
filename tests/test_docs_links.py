"""The documentation a newcomer reads: every relative link of the README, docs/ and eval/
resolves (a file that exists; a #anchor into a Markdown file names one of its headings, by
GitHub's anchor rules), every http(s) link is well-formed (nothing is fetched), the README
stays a front page, and the text speaks of dates and versions, not of rounds of work."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 260
# the phrases of a lab notebook, not of a manual (matched case-insensitively, as words)
BANNED = ("this session", "last session", "previous session", "next session", "third session", "fourth session",
          "fifth session", "sixth session", "this round", "last round", "this stop")

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may hold one level of parentheses
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?((?:[^()\s<>]|\([^()\s]*\))*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "eval" / "README.md", ROOT / "eval" / "HISTORY.md"]
    return [f for f in files if f.exists()]


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code."""
    out = []
    for n, line in _prose_lines(text):
        m = _REFDEF.match(line)
        if m:
            out.append((n, m.group(1)))
            continue
        bare = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        out += [(n, m.group(1)) for m in _INLINE.finditer(bare)]
    return out


def _heading_text(raw: str) -> str:
    """A heading's text as GitHub renders it: code spans keep their text, links their
    label, images their alt text, emphasis markers and HTML tags go."""
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    s = _CODE_SPAN.sub(lambda m: m.group(2), s)
    s = re.sub(r"<[^>]+>", "", s)
    s = re.sub(r"(\*\*|__|\*)(.+?)\1", r"\2", s)
    return s


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than '-' and '_' dropped,
    each space a '-'."""
    s = _heading_text(heading).strip().lower()
    s = "".join(c for c in s if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return s.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file offers: its headings' (a repeated one gets -1, -2, ...)
    and any explicit <a id=...> / <a name=...>."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
        out.update(_HTML_ANCHOR.findall(line))
    return out


def well_formed_url(url: str) -> bool:
    """An http(s) URL with a host name (or an IP address, or localhost) and a valid port."""
    if re.search(r"\s", url):
        return False
    parts = urlsplit(url)
    try:
        host, _ = parts.hostname, parts.port  # a bad port raises
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", host):
        return True
    labels = host.split(".")
    return len(labels) >= 2 and all(re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", label) for label in labels)


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every link of `path` that does not resolve."""
    text = path.read_text(encoding="utf-8")
    problems = []
    own = None
    for n, target in links(text):
        where = f"{path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name}:{n}: {target}"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            scheme = target.split(":", 1)[0].lower()
            if scheme in ("http", "https"):
                if not well_formed_url(target):
                    problems.append(f"{where} (malformed URL)")
            elif scheme != "mailto":
                problems.append(f"{where} (scheme {scheme}: is not checked; use a relative link or http(s))")
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if file_part.startswith("/"):
            problems.append(f"{where} (absolute path: use a path relative to the file)")
            continue
        if not dest.exists():
            problems.append(f"{where} (no such file)")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() != ".md":
                continue  # an anchor into a non-Markdown file (a line of code) is not checked
            if dest == path:
                own = own if own is not None else anchors(text)
                have = own
            else:
                have = anchors(dest.read_text(encoding="utf-8"))
            if unquote(anchor).lower() not in have:
                problems.append(f"{where} (no heading with the anchor #{anchor})")
    return problems


def banned_phrases(path: Path) -> list[str]:
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for phrase in BANNED:
            if re.search(r"\b" + re.escape(phrase) + r"\b", line, re.I):
                found.append(f"{path.name}:{n}: “{phrase}”")
    return found


# ---------------------------------------------------------------- the checker itself


def test_the_anchor_rules_are_githubs():
    assert slug("Set-up: two commands") == "set-up-two-commands"
    assert slug("`ragkit doctor --simulate`: how fast will it run") == "ragkit-doctor---simulate-how-fast-will-it-run"
    assert slug("2026-12-02: Outcomes: supported, unverified, not_found (issue 23)") == \
        "2026-12-02-outcomes-supported-unverified-not_found-issue-23"
    assert slug("Reranker: the registry's cross-encoder") == "reranker-the-registrys-cross-encoder"
    assert slug("**Bold** and [a link](x.md)") == "bold-and-a-link"
    text = "# A\n\n## Notes\n\n```\n## not a heading\n```\n\n## Notes\n<a id=\"here\"></a>\n"
    assert anchors(text) == {"a", "notes", "notes-1", "here"}


def test_the_checker_reports_a_broken_link_and_passes_good_ones(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section, with punctuation!\n", encoding="utf-8")
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Local heading\n\n"
        "[good](other.md) [good anchor](other.md#a-section-with-punctuation) ![img](pic.png)\n"
        "[here](#local-heading) [web](https://example.org/a?b=c#d)\n"
        "[missing file](nowhere.md) [missing anchor](other.md#no-such-section) [bad local](#nope)\n"
        "[bad url](https://example..org/x) [no host](https:///path) [bad port](http://localhost:99999/)\n"
        "`[in code](not-checked.md)`\n\n```\n[in a fence](also-not-checked.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    text = "\n".join(problems)
    assert len(problems) == 6, problems
    assert "nowhere.md (no such file)" in text
    assert "other.md#no-such-section (no heading with the anchor #no-such-section)" in text
    assert "#nope (no heading" in text
    assert text.count("(malformed URL)") == 3
    assert "not-checked" not in text
    page.write_text("Notes from this Session, and the LAST ROUND.\n", encoding="utf-8")
    assert len(banned_phrases(page)) == 2


# ---------------------------------------------------------------- the project's docs


def test_the_docs_are_there():
    names = {p.relative_to(ROOT).as_posix() for p in doc_files()}
    for need in ("README.md", "eval/README.md", "eval/HISTORY.md", "docs/testing.md", "docs/compare.md"):
        assert need in names


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_text_speaks_of_dates_and_versions_not_rounds_of_work(path):
    assert banned_phrases(path) == []


def test_the_readme_is_a_front_page_that_names_the_test_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for command in ("make demo", "make test", "make test-all"):
        assert command in text
