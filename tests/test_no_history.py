"""The project speaks of itself only: no development history ("session N") and no paths into
folders users do not have, in the docs, the code, the suites, the tests or the tools."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["README.md", "docs", "pytest_attnperf", "suites", "tests", "tools"]
# built here so this file does not match itself
HISTORY = re.compile("sess" + r"ion \d+", re.IGNORECASE)
OUTSIDE = ["sha" + "red/" + name for name in ("seeds", "FACTS", "STYLE")] + [".." + "/sha" + "red"]


def _text_files() -> list[Path]:
    files: list[Path] = []
    for place in PLACES:
        path = ROOT / place
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in candidates:
            if "__pycache__" in file.parts:
                continue
            try:
                file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # not text
            files.append(file)
    return files


def test_no_history_or_outside_paths() -> None:
    hits = []
    for file in _text_files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line) or any(token in line for token in OUTSIDE):
                hits.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "history or outside paths:\n" + "\n".join(hits)
