"""The command-line reference in the docs against the argument parser: every flag of every
`tfdist` command is documented on its page, and every flag a flag table names exists. Also
what `tfdist doctor` says it runs (its sample output, the README) against its scenarios."""

import argparse
import ast
import re

import pytest

from tfdist.cli import build_parser, doctor
from tfdist.fixes import FIXES

from helpers.docs import DOCS, prose
from helpers.paths import ROOT

# Each command -> (the page that documents it, the heading of its section there or None for
# the whole page).
PAGES = {
    "env": ("launcher.md", "## tfdist env"),
    "tf-config": ("launcher.md", "## tfdist tf-config"),
    "launch": ("launcher.md", "## tfdist launch"),
    "horovodrun": ("horovod.md", None),
    "serve": ("launcher.md", "## tfdist serve"),
    "doctor": ("launcher.md", "## tfdist doctor"),
    "verify": ("testing.md", "## tfdist verify"),
}


def _commands():
    """Each command's parser, by its name (aliases with underscores left out)."""
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: parser for name, parser in action.choices.items() if "_" not in name}


def _flags(parser):
    """The documented form of each visible flag: its options (e.g. ["--max-restarts", ...])."""
    return [
        action.option_strings
        for action in parser._actions
        if action.option_strings
        and action.help is not argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction)
    ]


def _section(page, heading):
    text = "\n" + (DOCS / page).read_text()
    if heading is None:
        return text
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _named(text, option):
    """`option` appears in `text` in backticks, alone or with its value (`--ps M`)."""
    return re.search(rf"`{re.escape(option)}(?=[ `=\[,])", text) is not None


def test_every_command_has_its_page():
    assert set(_commands()) == set(PAGES)
    table = _section("launcher.md", "# Launcher and command line")
    listed = set(re.findall(r"^\| `tfdist ([\w-]+)` \|", table, re.M))
    assert listed == set(PAGES), "the command table of docs/launcher.md lists every command"


@pytest.mark.parametrize("command", sorted(PAGES))
def test_every_flag_of_a_command_is_documented(command):
    section = _section(*PAGES[command])
    missing = [
        options[0] for options in _flags(_commands()[command]) if not any(
            _named(section, option) for option in options
        )
    ]  # fmt: skip
    assert not missing, f"docs/{PAGES[command][0]} does not document tfdist {command} {missing}"


@pytest.mark.parametrize("command", sorted(PAGES))
def test_every_flag_a_flag_table_names_exists(command):
    known = {option for options in _flags(_commands()[command]) for option in options}
    hidden = {
        option
        for action in _commands()[command]._actions
        if action.help is argparse.SUPPRESS
        for option in action.option_strings
    }
    section = _section(*PAGES[command])
    rows = [line for line in section.splitlines() if re.match(r"^\| `-", line)]
    named = {flag for row in rows for flag in re.findall(r"`(-{1,2}[\w-]+)", row.split("|")[1])}
    assert named - known - hidden == set(), f"tfdist {command} has no such flags"


def test_the_launch_synopsis_has_every_flag():
    section = _section("launcher.md", "## tfdist launch")
    synopsis = re.search(r"```bash\n(tfdist launch .*?)```", section, re.S).group(1)
    missing = [
        options[0]
        for options in _flags(_commands()["launch"])
        if not any(re.search(rf"\[{re.escape(o)}[ \]]", synopsis) for o in options)
    ]
    assert not missing, f"the synopsis of tfdist launch lacks {missing}"


# ------------------------------------------------------------------------- tfdist doctor


def test_the_doctor_runs_the_scenarios_it_names():
    """SCENARIO_FIXES names the smoke job's scenarios, in its order, and real fixes."""
    tree = ast.parse((ROOT / "tfdist" / "launcher" / "smoke_job.py").read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "checks":
            names += [key.value for key in node.value.keys]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            if getattr(node.targets[0].value, "id", "") == "checks":
                names.append(node.targets[0].slice.value)
    assert names == list(doctor.SCENARIO_FIXES)
    covered = [fix for fixes in doctor.SCENARIO_FIXES.values() for fix in fixes]
    assert set(covered) <= set(FIXES)


def test_the_doctors_sample_output_is_what_it_prints():
    section = _section("launcher.md", "## tfdist doctor")
    sample = re.search(r"```text\n(.*?)```", section, re.S).group(1).splitlines()
    assert doctor.smoke_test_header() in sample
    nccl = sample.index(doctor.smoke_test_header()) - 1
    assert sample[nccl] == doctor.nccl_line(["/cpu:0"], None)  # what a CPU host prints
    start = sample.index(doctor.smoke_test_header()) + 1
    lines = [doctor.scenario_line(name, "ok") for name in doctor.SCENARIO_FIXES]
    assert sample[start : start + len(lines)] == lines
    for name, fixes in doctor.SCENARIO_FIXES.items():
        (row,) = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
        assert set(re.findall(r"`(\w+)`", row.split("|")[3])) == set(fixes), name


def test_what_the_docs_say_the_doctor_runs_is_what_it_runs():
    fixes = {fix for covered in doctor.SCENARIO_FIXES.values() for fix in covered}
    claim = f"{len(doctor.SCENARIO_FIXES)} multi-worker scenarios that exercise {len(fixes)} of"
    readme = prose(ROOT / "README.md")
    assert claim + " the fixes" in readme
    assert all(f"`{name}`" in readme for name in doctor.SCENARIO_FIXES)
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = prose(path)
        for said in re.findall(r"(\d+ multi-worker scenarios that exercise \d+ of)", text):
            assert said == claim, f"{path.relative_to(ROOT)} says {said!r}"
        assert "runs the scenarios that exercise" not in text, path
