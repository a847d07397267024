"""The documentation's own checks that run nothing: its Python examples are found (and few
are left out), and every TFDIST_* variable is documented. Running the examples and building the
site: tests/cluster/test_docs_build.py."""

import re

from helpers.docs import DOCS, NOT_RUN, NOT_RUN_BLOCKS, PAGES, ROOT

MAX_NOT_RUN = 5


def test_examples_are_found_and_few_are_left_out():
    runnable = sum(len(blocks) for blocks in PAGES.values())
    assert runnable >= 20, f"only {runnable} runnable python blocks found under docs/"
    assert len(NOT_RUN_BLOCKS) <= MAX_NOT_RUN, (
        f"{len(NOT_RUN_BLOCKS)} python blocks are marked '{NOT_RUN}' (at most {MAX_NOT_RUN}): "
        f"{NOT_RUN_BLOCKS}"
    )


def test_every_tfdist_variable_is_documented():
    names = set()
    for path in (ROOT / "tfdist").glob("*.py"):
        names |= set(re.findall(r"TFDIST_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    documented = (DOCS / "environment-variables.md").read_text()
    assert names and not sorted(n for n in names if f"`{n}`" not in documented)
