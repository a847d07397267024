"""The documentation's own checks that run nothing: its Python examples are found (and few
are left out), every TFDIST_* variable is documented, and the README's "What works where"
table is the site's too (included, never copied). Running the examples and building the
site: tests/cluster/test_docs_build.py."""

import re

import pytest

from helpers.docs import DOCS, NOT_RUN, NOT_RUN_BLOCKS, PAGES, ROOT

HOOKS = DOCS / "hooks"

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


def test_the_extras_table_names_every_extra_of_setup_cfg():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"])
    page = (DOCS / "getting-started.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.M))
    assert listed == extras, (
        f"docs/getting-started.md lists {sorted(listed)}; setup.cfg has {sorted(extras)}"
    )


# ------------------------------------------------------------- one text, README and site


def _readme_hook():
    """docs/hooks/readme.py, the mkdocs hook that includes README sections in pages."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_readme_hook", HOOKS / "readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_what_works_where_table_is_the_readmes_own():
    """docs/index.md includes the README's table at build time; no page keeps a copy."""
    index = (DOCS / "index.md").read_text()
    assert '<!-- included: README.md "What works where" -->\n' in index
    table = _readme_hook().section("What works where")
    header = "| scenario | Keras 3 alone | tf_keras alone | tfdist | test |"
    assert table.count(header) == 1 and table.count("\n| ") >= 20
    assert table in (ROOT / "README.md").read_text()
    for path in DOCS.rglob("*.md"):
        assert header not in path.read_text(), f"{path.relative_to(ROOT)} copies the table"
    filled = _readme_hook().fill(index)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert all(row in filled.splitlines() for row in rows)
    assert "<!-- included:" not in filled
    assert "  - docs/hooks/readme.py\n" in (ROOT / "mkdocs.yml").read_text()


def test_the_readme_hook_makes_docs_links_relative_and_refuses_unknown_sections():
    hook = _readme_hook()
    readme = "# t\n\n## A\n\nsee [x](docs/x.md)\n\n## B\n"
    assert hook.section("A", readme) == "see [x](docs/x.md)"
    hook.README = type("Text", (), {"read_text": staticmethod(lambda: readme)})
    assert hook.fill('<!-- included: README.md "A" -->', depth=1) == "see [x](../x.md)"
    with pytest.raises(ValueError, match="no section 'C'. Choose one of: A, B"):
        hook.fill('<!-- included: README.md "C" -->')
