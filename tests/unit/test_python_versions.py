"""The Python versions tfdist serves: one floor in tfdist/releases.py, stated the same in
setup.cfg and the README, and `import tfdist` refusing an older Python with a message that says
which to use."""

import configparser
import re
import subprocess
import sys

import pytest

from tfdist import releases

from helpers.paths import ROOT


def test_the_floor_is_the_oldest_python_a_tested_pair_installs_on():
    assert releases.PYTHON_FLOOR == (3, 9)
    assert releases.OLDEST.python_range == ((3, 9), (3, 12))
    assert releases.NEWEST.python_range == ((3, 11), (3, 13))
    for release in releases.MATRIX:
        oldest, newest = release.python_range
        assert releases.PYTHON_FLOOR <= oldest <= newest, release


def test_python_requires_states_the_floor():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    floor = ".".join(map(str, releases.PYTHON_FLOOR))
    assert config["options"]["python_requires"].strip() == f">={floor}"


def _table_rows(text):
    """The cells of a Markdown table's rows, under its header."""
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def _expected_rows():
    return [
        [r.tensorflow, r.keras, r.tf_keras, r.python.replace("-", " to ")] for r in releases.MATRIX
    ]


def test_the_readme_states_each_pairs_python_versions():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- python table: tfdist/releases.py -->")[1].split("<!-- end")[0]
    assert _table_rows(block) == _expected_rows()


def test_the_releases_page_states_each_pairs_python_versions():
    text = (ROOT / "docs" / "releases.md").read_text()
    block = text.split("## The tested matrix")[1].split("\n\n")[1]
    assert block.startswith("| TensorFlow | Keras 3 | tf_keras | Python |")
    assert _table_rows(block) == _expected_rows()


def test_a_supported_python_passes():
    releases.check_python((3, 9, 0))
    releases.check_python((3, 13, 1, "final", 0))
    releases.check_python()  # the running one


@pytest.mark.parametrize("old", [(3, 8, 18), (3, 7, 0)])
def test_an_older_python_is_refused_naming_it_and_the_fix(old):
    with pytest.raises(ImportError) as raised:
        releases.check_python(old)
    message = str(raised.value)
    running = ".".join(map(str, old))
    assert f"Received: Python {running} ({sys.executable})" in message
    assert "tfdist needs Python 3.9 or newer" in message
    assert "HINT: make the virtualenv with a newer Python" in message
    assert "needs Python 3.11-3.13" in message  # the newest pair


def test_the_check_reads_the_running_pythons_version(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 8, 10, "final", 0))
    with pytest.raises(ImportError, match=r"Received: Python 3\.8\.10 "):
        releases.check_python()


def test_import_tfdist_refuses_an_older_python():
    """The check runs first in `import tfdist`: a Python that looks like 3.8 gets its error."""
    code = "import sys; sys.version_info = (3, 8, 10, 'final', 0); import tfdist"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"ImportError: tfdist needs Python 3\.9 or newer", last), proc.stderr
