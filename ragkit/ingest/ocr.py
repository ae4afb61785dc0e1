"""OCR for PDF pages that have no text layer, through the tesseract command line.

tesseract is an optional system program (Debian/Ubuntu: `apt-get install tesseract-ocr
tesseract-ocr-eng`, plus `tesseract-ocr-chi-sim` etc. for other languages). It runs
offline, about 9 s a page on 2 cores. The page is rendered by pypdfium2 to a grayscale
bitmap and piped to tesseract as a PGM image, so neither PIL nor a temporary file is
needed.
"""

from __future__ import annotations

import shutil
import subprocess

INSTALL_HINT = "install tesseract to read it (Debian/Ubuntu: apt-get install tesseract-ocr tesseract-ocr-eng)"

DPI = 300  # tesseract's recommended resolution for body text


class OcrError(Exception):
    """One-line reason an OCR run failed."""


def tesseract() -> str | None:
    return shutil.which("tesseract")


def page_has_images(page) -> bool:
    import pypdfium2.raw as pdfium_c

    for _ in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=2):
        return True
    return False


def ocr_page(page, lang: str = "eng", *, exe: str | None = None, timeout_s: float = 300.0) -> str:
    """Text of one pypdfium2 page by OCR. Raises OcrError with a one-line reason."""
    exe = exe or tesseract()
    if exe is None:
        raise OcrError("OCR is not available: " + INSTALL_HINT)
    bitmap = page.render(scale=DPI / 72, grayscale=True)
    try:
        arr = bitmap.to_numpy()
        if arr.ndim == 3:  # some builds hand back a channel axis even for grayscale
            arr = arr[:, :, 0]
        h, w = arr.shape[:2]
        pgm = b"P5\n%d %d\n255\n" % (w, h) + arr.tobytes()
    finally:
        bitmap.close()
    try:
        r = subprocess.run(
            [exe, "stdin", "stdout", "-l", lang, "--psm", "3"],
            input=pgm, capture_output=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        raise OcrError(f"OCR took over {timeout_s:.0f} s on one page") from None
    except OSError as exc:
        raise OcrError(f"cannot run tesseract: {exc.strerror or exc}") from None
    if r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace")
        if "Failed loading language" in err or "Error opening data file" in err:
            raise OcrError(
                f"OCR language {lang!r} is not installed for tesseract (setting ingest.ocr_lang); "
                f"Debian/Ubuntu: apt-get install tesseract-ocr-{lang.split('+')[0].replace('_', '-').lower()}"
            )
        first = next((ln for ln in err.splitlines() if ln.strip()), f"exit status {r.returncode}")
        raise OcrError(f"tesseract failed: {first[:200]}")
    return r.stdout.decode("utf-8", "replace")
