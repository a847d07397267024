"""mkdocs hook: the parts of the site that are facts of tfdist's strategy registry.

- The "Strategies" section of the navigation is `tfdist.strategy.registry.markdown_nav()`:
  one page per strategy record (mkdocs.yml leaves that section empty).
- A line `<!-- generated: tfdist.strategy.registry.NAME() -->` in a page is replaced by what
  that function returns (`markdown_table`, `markdown_auto`, `markdown_options`).

So a new strategy (its builder, its record, its page) reaches the site with no other edit.
"""

import re

from tfdist.strategy import registry

MARKER = re.compile(r"^<!-- generated: tfdist\.strategy\.registry\.(\w+)\(\) -->$", re.M)
GENERATORS = {
    "markdown_table": registry.markdown_table,
    "markdown_auto": registry.markdown_auto,
    "markdown_options": registry.markdown_options,
}
SECTION = "Strategies"


def fill(markdown: str) -> str:
    """`markdown` with each marker line replaced by its generator's output.

    Raises:
        ValueError: a marker names a function that is not a generator.
    """

    def generated(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(
                f"{match.group(0)} names no generator. Choose one of: {', '.join(GENERATORS)}."
            )
        return GENERATORS[name]().rstrip("\n")

    return MARKER.sub(generated, markdown)


def on_config(config):
    for entry in config["nav"]:
        if isinstance(entry, dict) and SECTION in entry:
            entry[SECTION] = registry.markdown_nav()
            return config
    raise ValueError(f"mkdocs.yml's nav has no {SECTION!r} section for the strategy pages.")


def on_page_markdown(markdown, page, config, files):
    return fill(markdown)
