"""A run's answers file (`answers.jsonl`, the checkpoint `ragkit eval run` appends to), read
back by the run, the rescore, and the rows for a spreadsheet."""

from __future__ import annotations

import json
from pathlib import Path

ANSWERS = "answers.jsonl"


def read_answers(path: Path, *, repair: bool = False) -> dict[str, dict]:
    """Records by question id. A last line without its newline (the process was killed
    while writing it) is ignored, and with `repair` cut off the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    out: dict[str, dict] = {}
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            out[rec["id"]] = rec
    return out
