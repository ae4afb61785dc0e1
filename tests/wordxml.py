"""Word files as lawyers exchange them, written by the tests: python-docx makes the package
(styles, section, header and footer parts), the body is Word's own XML (tracked changes,
content controls, text boxes, note and comment references), and footnotes, endnotes and
comments are parts related the way Word relates them. And the check that nothing is
lost: every w:t of the main document, its text boxes, footnotes and endnotes appears in
the ingested text, in order."""

from __future__ import annotations

import re
from pathlib import Path

NS = {
    "w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "mc": "http://schemas.openxmlformats.org/markup-compatibility/2006",
    "wps": "http://schemas.microsoft.com/office/word/2010/wordprocessingShape",
    "wp": "http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing",
    "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
    "v": "urn:schemas-microsoft-com:vml",
    "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
}
DECL = " ".join(f'xmlns:{k}="{v}"' for k, v in NS.items())
W = "{%s}" % NS["w"]
MC = "{%s}" % NS["mc"]


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# ------------------------------------------------------------------ XML pieces

def run(text: str) -> str:
    return f'<w:r><w:t xml:space="preserve">{esc(text)}</w:t></w:r>'


def ins(inner: str, author: str = "Counsel", date: str = "2026-12-01T10:00:00Z", id: int = 101) -> str:
    return f'<w:ins w:id="{id}" w:author="{esc(author)}" w:date="{date}">{inner}</w:ins>'


def dele(text: str, author: str = "Counsel", date: str = "2026-12-01T10:00:00Z", id: int = 102) -> str:
    return (f'<w:del w:id="{id}" w:author="{esc(author)}" w:date="{date}"><w:r>'
            f'<w:delText xml:space="preserve">{esc(text)}</w:delText></w:r></w:del>')


def sdt_inline(inner: str, tag: str = "field") -> str:
    return f'<w:sdt><w:sdtPr><w:tag w:val="{tag}"/></w:sdtPr><w:sdtContent>{inner}</w:sdtContent></w:sdt>'


def hyperlink(inner: str) -> str:
    return f'<w:hyperlink w:anchor="x">{inner}</w:hyperlink>'


def smart_tag(inner: str) -> str:
    return f'<w:smartTag w:uri="urn:x" w:element="place">{inner}</w:smartTag>'


def text_box(paragraphs: str) -> str:
    """A text box as Word writes it: a DrawingML shape, with the VML copy as fallback."""
    return ('<w:r><mc:AlternateContent><mc:Choice Requires="wps"><w:drawing><wp:anchor><a:graphic><a:graphicData>'
            f'<wps:wsp><wps:txbx><w:txbxContent>{paragraphs}</w:txbxContent></wps:txbx></wps:wsp>'
            '</a:graphicData></a:graphic></wp:anchor></w:drawing></mc:Choice><mc:Fallback><w:pict><v:shape><v:textbox>'
            f'<w:txbxContent>{paragraphs}</w:txbxContent></v:textbox></v:shape></w:pict></mc:Fallback></mc:AlternateContent></w:r>')


def footnote_ref(n: int) -> str:
    return f'<w:r><w:rPr><w:rStyle w:val="FootnoteReference"/></w:rPr><w:footnoteReference w:id="{n}"/></w:r>'


def endnote_ref(n: int) -> str:
    return f'<w:r><w:endnoteReference w:id="{n}"/></w:r>'


def comment_range(cid: int, inner: str) -> str:
    return (f'<w:commentRangeStart w:id="{cid}"/>{inner}<w:commentRangeEnd w:id="{cid}"/>'
            f'<w:r><w:commentReference w:id="{cid}"/></w:r>')


def para(inner: str, style: str | None = None) -> str:
    ppr = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
    return f"<w:p>{ppr}{inner}</w:p>"


def sdt_block(blocks: str) -> str:
    return f'<w:sdt><w:sdtPr><w:alias w:val="Cover"/></w:sdtPr><w:sdtContent>{blocks}</w:sdtContent></w:sdt>'


def table(rows: list[list[str]]) -> str:
    """`rows` of cells, each cell's block XML."""
    body = "".join("<w:tr>" + "".join(f"<w:tc>{c or '<w:p/>'}</w:tc>" for c in r) + "</w:tr>" for r in rows)
    return f"<w:tbl><w:tblPr/>{body}</w:tbl>"


# ------------------------------------------------------------------ the package

def _notes_xml(kind: str, notes: dict[int, str]) -> bytes:
    sep = (f'<w:{kind} w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:{kind}>'
           f'<w:{kind} w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/></w:r></w:p></w:{kind}>')
    body = "".join(f'<w:{kind} w:id="{i}">{xml}</w:{kind}>' for i, xml in notes.items())
    return f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:{kind}s {DECL}>{sep}{body}</w:{kind}s>'.encode()


def write_docx(path: Path, body: str, *, footnotes: dict[int, str] | None = None, endnotes: dict[int, str] | None = None,
               comments: list[tuple[int, str, str, str]] | None = None, header: str | None = None,
               footer: str | None = None, more_sections: tuple[str, ...] = ()) -> Path:
    """A .docx whose body is `body` (block XML). `footnotes` / `endnotes`: id -> block XML;
    `comments`: (id, author, ISO date, text); `more_sections`: the block XML of further
    sections, each with the same header and footer (Word shows them on every page)."""
    import docx
    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from docx.opc.packuri import PackURI
    from docx.opc.part import Part
    from docx.oxml import parse_xml
    from docx.oxml.ns import qn

    d = docx.Document()
    root = d.element.body
    for child in list(root):
        if child.tag != qn("w:sectPr"):
            root.remove(child)
    sect = root.find(qn("w:sectPr"))
    frag = parse_xml(f"<w:body {DECL}>{body}</w:body>")
    for child in list(frag):
        sect.addprevious(child)
    for more in more_sections:  # a section break (a paragraph holding a sectPr) before each
        import copy

        brk = parse_xml(f"<w:p {DECL}><w:pPr></w:pPr></w:p>")
        brk.find(qn("w:pPr")).append(copy.deepcopy(sect))
        sect.addprevious(brk)
        for child in list(parse_xml(f"<w:body {DECL}>{more}</w:body>")):
            sect.addprevious(child)
    if header is not None:
        d.sections[0].header.paragraphs[0].text = header
    if footer is not None:
        d.sections[0].footer.paragraphs[0].text = footer
    part = d.part
    ct = "application/vnd.openxmlformats-officedocument.wordprocessingml."
    for kind, notes, rt in (("footnote", footnotes, RT.FOOTNOTES), ("endnote", endnotes, RT.ENDNOTES)):
        if notes:
            p = Part(PackURI(f"/word/{kind}s.xml"), f"{ct}{kind}s+xml", _notes_xml(kind, notes), part.package)
            part.relate_to(p, rt)
    if comments:
        body_xml = "".join(
            f'<w:comment w:id="{i}" w:author="{esc(a)}" w:date="{dt}" w:initials="C"><w:p>{run(t)}</w:p></w:comment>'
            for i, a, dt, t in comments)
        xml = f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:comments {DECL}>{body_xml}</w:comments>'
        existing = [r for r in part.rels.values() if r.reltype == RT.COMMENTS]
        if existing:  # python-docx's template already has a comments part: fill it
            target = existing[0].target_part
            target._element = parse_xml(xml.encode())
        else:
            part.relate_to(Part(PackURI("/word/comments.xml"), f"{ct}comments+xml", xml.encode(), part.package),
                           RT.COMMENTS)
    d.save(str(path))
    return path


# ------------------------------------------------------------------ the check

def stories(path: Path) -> dict[str, list[str]]:
    """Every w:t text a reader of the file sees, story by story, in document order: the main
    document (text boxes and struck text left out), each text box, each footnote and
    endnote the document references. The fallback copy of an mc:AlternateContent is the
    same content again and is not read twice."""
    import zipfile

    from lxml import etree

    with zipfile.ZipFile(path) as zf:
        def root(name):
            return etree.fromstring(zf.read(name)) if name in zf.namelist() else None

        doc, notes = root("word/document.xml"), {"footnote": root("word/footnotes.xml"), "endnote": root("word/endnotes.xml")}
    out: dict[str, list[str]] = {"main": []}
    boxes: list = []

    def walk(el, story: list[str]) -> None:
        for child in el:
            tag = child.tag
            if tag == f"{MC}Fallback" or tag in (f"{W}del", f"{W}moveFrom"):
                continue
            if tag == f"{W}txbxContent":
                boxes.append(child)
                continue
            if tag == f"{W}t" and child.text:
                story.append(child.text)
            walk(child, story)

    walk(doc, out["main"])
    i = 0
    while i < len(boxes):  # text boxes may hold text boxes
        story: list[str] = []
        out[f"text box {i + 1}"] = story
        walk(boxes[i], story)
        i += 1
    for kind in ("footnote", "endnote"):
        if notes[kind] is None:
            continue
        refs = [r.get(f"{W}id") for r in doc.iter(f"{W}{kind}Reference")]
        by_id = {n.get(f"{W}id"): n for n in notes[kind].iter(f"{W}{kind}")}
        for rid in refs:
            if rid in by_id:
                story = []
                out[f"{kind} {rid}"] = story
                walk(by_id[rid], story)
    return out


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s.replace("\\|", "|"))


def lost_texts(path: Path, ingested: str) -> list[str]:
    """The w:t texts of `path` (see `stories`) that the ingested text does not hold in
    their story's order (whitespace aside; Markdown's escaped '|' read as '|'; a final
    '.', ':' or ';', which a heading drops in its section path, aside): [] when nothing
    is lost."""
    have = _squash(ingested)
    lost = []
    for name, texts in stories(path).items():
        at = 0
        for t in texts:
            want = _squash(t).rstrip(".:;。：；")
            if not want:
                continue
            j = have.find(want, at)
            if j < 0:
                lost.append(f"{name}: {t!r}")
            else:
                at = j + len(want)
    return lost
