"""The fenced Python blocks of docs/**/*.md, found once, and a page's prose as one line, for the
docs tests of every tier."""

import re
from pathlib import Path

from helpers.paths import ROOT

DOCS = ROOT / "docs"
NOT_RUN = "not run"

# An opening fence (any indentation, e.g. inside an admonition), its info string, and the body
# up to the closing fence of the same indentation.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


def prose(path: Path) -> str:
    """The text of a page with every run of whitespace (line breaks too) as one space: a
    sentence is found whichever words the page's lines break between."""
    return " ".join(path.read_text().split())


def code_blocks(path: Path):
    """(line of the first code line, info string, code) of every fenced block of a page."""
    text = path.read_text()
    for match in FENCE.finditer(text):
        indent = match.group("indent")
        lines = match.group("body").splitlines()
        code = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines
        )
        line = text.count("\n", 0, match.start("body")) + 1
        yield line, match.group("info").strip(), code + "\n"


def python_blocks():
    """{page: [blocks to run]} and the list of blocks marked as not run."""
    pages, not_run = {}, []
    for path in sorted(DOCS.rglob("*.md")):
        page = str(path.relative_to(ROOT))
        for line, info, code in code_blocks(path):
            language = info.split()[0] if info else ""
            if language not in ("python", "py"):
                continue
            title = re.search(r'title="([^"]*)"', info)
            if title and NOT_RUN in title.group(1):
                not_run.append(f"{page}:{line}")
                continue
            pages.setdefault(page, []).append({"page": str(path), "line": line, "code": code})
    return pages, not_run


PAGES, NOT_RUN_BLOCKS = python_blocks()
