"""The node ids read from standard input (``pytest --collect-only -q`` lines) that have no entry in a
baseline file (default ``baselines/h200.yaml``), one a line: what a recording still has to measure.

    pytest suites/test_linear.py --hw=h200 --collect-only -q | python tools/missing.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

NODE_ID = re.compile(r"^[\w./-]+\.py::\S+$")  # a collected test; not a warning that holds "::"


def missing(lines: list[str], entries: dict[str, object]) -> list[str]:
    """The node ids among ``lines`` that ``entries`` lacks, each once, in order."""
    ids = (line.strip() for line in lines)
    return list(dict.fromkeys(i for i in ids if NODE_ID.match(i) and i not in entries))


def main(argv: list[str]) -> int:
    """Print the missing node ids; the file is the first argument."""
    path = Path(argv[0] if argv else "baselines/h200.yaml")
    entries = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("entries", {}) if path.exists() else {}
    for node in missing(sys.stdin.read().splitlines(), entries):
        print(node)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
