"""The project speaks of itself only: no development history ("session N") and no paths into
folders users do not have, in the docs, the code, the suites, the tests or the tools.

The package says what and why; measured evidence (a measurement's date, what happened on one
machine) lives in docs/, and the code points there. Every file and section that the README, the
docs, the package and the suites point to exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["README.md", "docs", "pytest_attnperf", "noise_benchmark", "suites", "tests", "tools"]
PACKAGE = ROOT / "pytest_attnperf"
# built here so this file does not match itself
HISTORY = re.compile("sess" + r"ion \d+", re.IGNORECASE)
OUTSIDE = ["sha" + "red/" + name for name in ("seeds", "FACTS", "STYLE")] + [".." + "/sha" + "red", "dev" + "checks/"]
# In the package only (docs/ and CHANGELOG.md keep their dates and machines):
DATE = re.compile(r"\b\d{4}" + "-" + r"\d{2}-\d{2}\b")  # YYYY-MM-DD
CARD = "H" + "200"
STORY = re.compile(  # "on the <card>", "two <card>s", "a 2-GPU <card> host", a device lease
    rf"\bon (?:the|an|a|one|two|three|four) {CARD}s?\b|\b{CARD} (?:host|machine|lease)s?\b|\b{CARD}s\b"
    + r"|\blea" + r"ses?\b",
    re.IGNORECASE,
)
# Exempt, narrowly:
# - the hardware table's vendor sources (hw/table.py, each row's ``source=`` string): data, citing
#   a vendor's document as it is titled, a card's name and a datasheet's date included;
TABLE = PACKAGE / "hw" / "table.py"
# What a doc or the package may point to: a path into one of the repository's folders (not one
# after a colon: ``rev:path`` names git's history, ``host:path`` another machine), a markdown link,
# and a page's section (``docs/gate.md, "Between machines"``).
REPO_PATH = re.compile(r"(?<![\w./~$:-])((?:docs|pytest_attnperf|noise_benchmark|suites|tools|tests|baselines|reports)"
                       r"/[\w./-]*)")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)  # examples, not pointers
SECTION = re.compile(r"""((?:docs/)?[\w-]+\.md|README),?\s+(?:#\s*)?(?:"([^"\n]+)"|'([^'\n]+)')""")


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


def _package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


REPOSITORY_FILES = "https://github.com/pytest-attnperf/pytest-attnperf/blob/main/"  # pyproject.toml's Homepage


def _suite_files() -> list[Path]:
    return sorted((ROOT / "suites").glob("*.py"))


def _noise_benchmark_files() -> list[Path]:
    """The repository's noise benchmark (not in the package): its pointers are checked as the package's."""
    return sorted((ROOT / "noise_benchmark").glob("*.py"))


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _lines_of(node: ast.AST) -> set[int]:
    start: int = getattr(node, "lineno", 0)
    end: int = getattr(node, "end_lineno", None) or start
    return set(range(start, end + 1))


def _vendor_source_lines() -> set[int]:
    """The lines of the hardware table's ``source=`` string literals (the f-string naming an
    unlisted card is no vendor's, and stays checked)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(TABLE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "source" and isinstance(node.value, ast.Constant):
            lines |= _lines_of(node.value)
    return lines


def _exempt() -> dict[Path, set[int]]:
    return {TABLE: _vendor_source_lines()}


def _hits(pattern: re.Pattern[str]) -> list[str]:
    exempt = _exempt()
    hits = []
    for file in _package_files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and number not in exempt.get(file, set()):
                hits.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _headings(doc: Path) -> list[str]:
    """A page's headings, lower case, without their ``#`` and backquotes."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    return [re.sub(r"^#+\s*", "", line).replace("`", "").strip().lower()
            for line in text.splitlines() if line.startswith("#")]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _has_section(doc: Path, name: str) -> bool:
    """``name`` is a heading of ``doc``, or the start of one ("Sample overhead" for "Sample overhead and
    ``--attnperf-machine-residual`` 0.5 us")."""
    name = name.replace("`", "").strip().lower()
    return any(h == name or (h.startswith(name) and not h[len(name)].isalnum()) for h in _headings(doc))


def _references(file: Path) -> list[tuple[int, str, Path, str | None, str | None]]:
    """``(line, as written, the path it names, its anchor, its section)`` for what ``file``
    points to: in a doc, its markdown links (relative to the doc's folder) and the repository paths
    in its inline code; in the package and the suites, the repository paths anywhere in their text
    (both relative to the root); in all, ``docs/x.md, "Section"`` pointers."""
    text = file.read_text(encoding="utf-8")
    found: list[tuple[int, str, Path, str | None, str | None]] = []
    if file.suffix == ".md":
        text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in LINK.finditer(text):
            target = match.group(1)
            if target.startswith(REPOSITORY_FILES):  # the README's links, absolute for an index page: this tree's files
                path, _, anchor = target[len(REPOSITORY_FILES):].partition("#")
                found.append((_line(text, match.start()), target, ROOT / path, anchor or None, None))
                continue
            if re.match(r"[a-z][\w+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor of this page
            path, _, anchor = target.partition("#")
            found.append((_line(text, match.start()), target, file.parent / path, anchor or None, None))
        spans = [(m.start(1), m.group(1)) for m in INLINE_CODE.finditer(text)]
    else:
        spans = [(0, text)]
    for start, span in spans:
        for match in REPO_PATH.finditer(span):
            written = match.group(1).rstrip(".")
            found.append((_line(text, start + match.start()), written, ROOT / written, None, None))
    for match in SECTION.finditer(text):
        doc = match.group(1)
        path = ROOT / "README.md" if doc == "README" else ROOT / doc if "/" in doc else file.parent / doc
        found.append((_line(text, match.start()), match.group(0), path, None, match.group(2) or match.group(3)))
    return found


def test_no_history_or_outside_paths() -> None:
    hits = []
    for file in _text_files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line) or any(token in line for token in OUTSIDE):
                hits.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "history or outside paths:\n" + "\n".join(hits)


def test_package_holds_no_dated_measurements() -> None:
    hits = _hits(DATE)
    assert not hits, "dates in the package (the measurement goes to docs/, the code points there):\n" + "\n".join(hits)


def test_package_tells_no_machine_stories() -> None:
    hits = _hits(STORY)
    assert not hits, ("what happened on a machine, in the package (the story goes to docs/; the code keeps what "
                      "and why, and points there):\n" + "\n".join(hits))


def test_exemptions_stay_narrow() -> None:
    table = TABLE.read_text(encoding="utf-8").splitlines()
    sources = _vendor_source_lines()
    assert sources, "the hardware table has no source= strings any more: drop its exemption"
    assert all('source="' in table[n - 1] or table[n - 1].lstrip().startswith('"') for n in sources)


def test_references_exist() -> None:
    hits = []
    for file in [*_doc_files(), *_package_files(), *_noise_benchmark_files(), *_suite_files()]:
        for number, written, path, anchor, section in _references(file):
            where = f"{file.relative_to(ROOT)}:{number}: {written}"
            if not path.exists():
                hits.append(f"{where} (no such file)")
            elif path.suffix != ".md":
                continue
            elif anchor is not None and anchor not in {_slug(h) for h in _headings(path)}:
                hits.append(f"{where} (no such anchor)")
            elif section is not None and not _has_section(path, section):
                hits.append(f"{where} (no such section)")
    assert not hits, "references to what the repository does not have:\n" + "\n".join(hits)


def test_the_readme_links_every_page_at_the_repository_so_an_index_page_reaches_it() -> None:
    """The README is the package's description on an index page and in an installed package's
    metadata, where a relative link leads nowhere: each link to a file of this tree is absolute,
    at the repository pyproject.toml names, and names a file that exists."""
    import tomllib

    text = FENCE.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    relative = [t for t in targets if not re.match(r"[a-z][\w+.-]*:", t) and not t.startswith("#")]
    assert relative == []
    home = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Homepage"]
    assert REPOSITORY_FILES == f"{home}/blob/main/"
    ours = [t[len(REPOSITORY_FILES):].partition("#")[0] for t in targets if t.startswith(REPOSITORY_FILES)]
    assert "docs/own-project.md" in ours
    assert [path for path in ours if not (ROOT / path).exists()] == []
