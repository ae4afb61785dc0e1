"""Render the Word comparison memo of two sample NDAs to docs/memo.png (the README's picture).

    .venv/bin/python eval/render_memo.py [--store DIR] [--items term,governing-law,nda-20,nda-12]
                                         [--docx memo.docx] [--out docs/memo.png] [--width 1400]

Ingests the two NDAs into a temporary store (or uses --store), compares them with the
default model (`ragkit.compare.compare`), writes the memo (`ragkit.compare.docx.to_docx`),
converts it to PDF with LibreOffice headless (a fresh profile each run) and renders the
first page with pypdfium2 at about --width pixels.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)
from ragkit.errors import RagkitError  # noqa: E402

DOCS = ["bonterms-mutual-nda-v1.pdf", "common-paper-mutual-nda-v1-standard-terms.md"]
ITEMS = "term,governing-law,nda-20,nda-12"


def docx_to_pdf(docx: Path, outdir: Path, timeout: float = 300) -> Path:
    """LibreOffice headless, with a profile of its own (no clash with a running soffice)."""
    soffice = shutil.which("soffice")
    if soffice is None:
        raise SystemExit("error: LibreOffice is not installed (soffice not on PATH): apt-get install libreoffice-writer-nogui")
    with tempfile.TemporaryDirectory(prefix="lo-profile-") as profile:
        proc = subprocess.run([soffice, f"-env:UserInstallation={Path(profile).as_uri()}", "--headless", "--convert-to", "pdf",
                               "--outdir", str(outdir), str(docx)], capture_output=True, text=True, timeout=timeout)
    pdf = outdir / (docx.stem + ".pdf")
    if proc.returncode != 0 or not pdf.exists():
        raise SystemExit(f"error: soffice could not convert {docx}: {proc.stdout}{proc.stderr}")
    return pdf


def first_page_png(pdf: Path, png: Path, width: int) -> tuple[int, int]:
    import pypdfium2 as pdfium

    page = pdfium.PdfDocument(str(pdf))[0]
    img = page.render(scale=width / page.get_width()).to_pil()
    png.parent.mkdir(parents=True, exist_ok=True)
    img.save(png, optimize=True)
    return img.size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=None, help="a store holding the two NDAs (default: ingest them into a temporary one)")
    ap.add_argument("--items", default=ITEMS, help=f"checklist items (default {ITEMS})")
    ap.add_argument("--docx", type=Path, default=None, help="also keep the .docx here")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "memo.png")
    ap.add_argument("--width", type=int, default=1400, help="pixels across the rendered page")
    args = ap.parse_args()

    from ragkit.compare import compare
    from ragkit.compare.docx import to_docx
    from ragkit.config import load_settings
    from ragkit.ingest import ingest

    with tempfile.TemporaryDirectory(prefix="ragkit-memo-") as tmp:
        work = Path(tmp)
        try:
            if args.store is None:
                settings = load_settings(store=work / "store")
                report = ingest([ROOT / "corpora" / "nda" / d for d in DOCS], settings)
                if report.failed:
                    print(f"error: ingest failed: {report.failed}", file=sys.stderr)
                    return 1
            else:
                settings = load_settings(store=args.store)
            result = compare(DOCS, settings, "nda", items=[i.strip() for i in args.items.split(",")],
                             on_progress=lambda d, i: print(f"  {d}: {i}", file=sys.stderr))
        except RagkitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        docx = args.docx or work / "memo.docx"
        to_docx(result, docx)
        size = first_page_png(docx_to_pdf(docx, work), args.out, args.width)
    print(f"wrote {args.out} ({size[0]}x{size[1]})" + (f" and {args.docx}" if args.docx else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
