"""The README's matrix table says "-" for what a pair did not run, never "pass"."""

import json

from helpers.matrix_table import render


def test_a_scenario_a_pair_ran_before_it_existed_is_not_run_not_passed(tmp_path):
    test = "tests/cluster/test_x.py::test_y"
    (tmp_path / "old.json").write_text(json.dumps({"a": {test: "passed"}, "_seconds": 60}))
    (tmp_path / "new.json").write_text(
        json.dumps({"a": {test: "passed"}, "b": {test: "failed"}, "_seconds": 120})
    )
    table = render(tmp_path, ["old", "new", "absent"]).splitlines()
    assert "| a | pass | pass | - |" in table
    assert "| b | - | FAIL 1/1 | - |" in table
    assert "| **scenarios passing** | 1/1 (1 not run) | 1/2 | - |" in table
