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


def test_the_next_keras_runs_are_columns_after_the_matrix(tmp_path):
    from helpers.matrix_table import columns

    test = "tests/cluster/test_x.py::test_y"
    for name in ("tf2.21.0-keras3.15.1", "next-tf2.21.0-keras3.16.0.dev2026102704"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"a": {test: "passed"}}))
    (tmp_path / "next-tf2.22.0.dev20260905-keras3.16.0.dev2026102704.json").write_text(
        json.dumps({"a": {test: "failed"}})
    )
    pairs = columns(tmp_path, ["tf2.16.2-keras3.3.3", "tf2.21.0-keras3.15.1"])
    assert pairs == [
        "tf2.16.2-keras3.3.3",
        "tf2.21.0-keras3.15.1",
        "next-tf2.21.0-keras3.16.0.dev2026102704",
        "next-tf2.22.0.dev20260905-keras3.16.0.dev2026102704",
    ]
    table = render(tmp_path, pairs).splitlines()
    assert table[0].endswith(
        "| next tf2.21.0 keras3.16.0.dev2026102704 "
        "| next tf2.22.0.dev20260905 keras3.16.0.dev2026102704 |"
    )
    assert "| a | - | pass | pass | FAIL 1/1 |" in table
