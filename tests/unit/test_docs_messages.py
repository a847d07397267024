"""The messages that docs/debugging.md quotes are the ones tfdist writes: every fixed part of
each quoted line (the words between the parts that vary: numbers, task names, shapes, `...`,
and punctuation) is in tfdist's source. A message reworded in the code, or in the page, fails
here until both agree."""

import re

import pytest

from helpers.docs import DOCS, ROOT

PAGE = DOCS / "debugging.md"
# Quoted lines that TensorFlow or Python write, not tfdist
NOT_TFDIST = ("The following tasks are unhealthy (stopped sending heartbeats)", "  File ")
_VARYING = re.compile(
    r"\.\.\.|\d+(?:\.\d+)?|(?:chief|worker|ps|evaluator):\d+|\[[^\]]*\]|\{[^}]*\}|`[^`]*`|"
    r"\"[^\"]*\"|'[^']*'|\S+\.py|"
    r"\b(?:kernel|bias|iteration|float32|int64)\b|(?<=differ in )(?:steps per epoch|epochs)"
)
_PREFIX = re.compile(r"^(?:\[(?:chief|worker|ps|evaluator):\d+\] |[A-Z]\w*Error: )")


def _quoted_lines():
    blocks = re.findall(r"```text\n(.*?)```", PAGE.read_text(), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def _source() -> str:
    """tfdist's source with adjacent string literals joined (a message split over lines)."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "tfdist").rglob("*.py")))
    return re.sub(r"[\"']\s*\n\s*(?:#[^\n]*\n\s*)*[rf]{0,2}[\"']", "", text)


SOURCE = _source()


def _fixed_parts(line: str) -> list:
    """The parts of `line` that no message varies: those of 10 characters or more, else (a
    line of short words, like the summary's) of 5 or more."""
    runs = _VARYING.split(_PREFIX.sub("", line))
    parts = [part.strip() for run in runs for part in re.split(r"[,:;()]|\. ", run)]
    return [part for part in parts if len(part) >= 10] or [p for p in parts if len(p) >= 5]


def test_the_page_quotes_messages():
    assert len(_quoted_lines()) >= 15


@pytest.mark.parametrize("line", _quoted_lines())
def test_each_quoted_message_is_the_codes(line):
    if _PREFIX.sub("", line).startswith(NOT_TFDIST):
        return
    parts = _fixed_parts(line)
    assert parts, f"no part of {line!r} is fixed text to check"
    missing = [part for part in parts if part not in SOURCE]
    assert not missing, f"docs/debugging.md quotes {line!r}; tfdist never writes {missing}"
