"""mkdocs hook: the parts of the site that the README holds, included rather than copied.

A line `<!-- included: README.md "TITLE" -->` in a page is replaced by the body of the
README's section `## TITLE` (up to the next heading of that level or above), so the site and the
README show one text: the "What works where" table is written once, in the README. Links in it
that point into docs/ ("docs/launcher.md") are made relative to the page.
"""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = re.compile(r'^<!-- included: README\.md "([^"]+)" -->$', re.M)


def section(title: str, readme: str = None) -> str:
    """The body of the README's `## title` section, without its heading.

    Raises:
        ValueError: the README has no such section; the message lists the ones it has.
    """
    text = README.read_text() if readme is None else readme
    headings = re.findall(r"^## (.+)$", text, re.M)
    if title not in headings:
        raise ValueError(
            f"README.md has no section {title!r}. Choose one of: {', '.join(headings)}."
        )
    start = re.search(rf"^## {re.escape(title)}\n", text, re.M).end()
    end = re.compile(r"^#{1,2} ", re.M).search(text, start)
    return text[start : end.start() if end else len(text)].strip("\n")


def fill(markdown: str, depth: int = 0) -> str:
    """`markdown` with each marker line replaced by the README section it names.

    depth: how many folders below docs/ the page is (its links into docs/ are rewritten so).
    """

    def included(match):
        body = section(match.group(1))
        return re.sub(r"\]\(docs/", "](" + "../" * depth, body)

    return MARKER.sub(included, markdown)


def on_page_markdown(markdown, page, config, files):
    return fill(markdown, page.file.src_uri.count("/"))
