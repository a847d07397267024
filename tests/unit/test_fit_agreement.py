"""How the workers' fit plans and variables are compared (tfdist.fit_agreement.difference and
variable_difference), pure functions. A real job: tests/cluster/test_differing_workers.py."""

import pytest

from tfdist import fit_agreement
from tfdist.fit_agreement import difference

NAMES = ["chief:0", "worker:0", "worker:1"]


def _plan(*shapes, epochs=2, steps=10):
    return {
        "variables": [[f"dense/v{i}", list(shape), "float32"] for i, shape in enumerate(shapes)],
        "epochs": epochs,
        "steps": steps,
    }


def test_the_same_plans_differ_in_nothing_whatever_the_variables_are_called():
    renamed = _plan([4, 8], [8])
    renamed["variables"][0][0] = "dense_3/kernel"  # another process numbered its layers on
    assert difference([_plan([4, 8], [8]), renamed, _plan([4, 8], [8])], NAMES) is None


@pytest.mark.parametrize(
    "other, expected",
    [
        (
            _plan([4, 16], [8]),
            "the models differ: variable 0 is dense/v0 [4, 8] float32 on chief:0, dense/v0 "
            "[4, 16] float32 on worker:1",
        ),
        (
            _plan([4, 8], [8], [8, 1]),
            "the models differ: worker:1 has 3 variables, chief:0 2 (the first of the others "
            "is dense/v2 [8, 1])",
        ),
        (
            _plan([4, 8], [8], steps=7),
            "the fits differ in steps per epoch: 10 on chief:0, 7 on worker:1",
        ),
        (_plan([4, 8], [8], epochs=3), "the fits differ in epochs: 2 on chief:0, 3 on worker:1"),
    ],
    ids=["a-shape", "a-variable-more", "steps", "epochs"],
)
def test_the_first_difference_names_both_tasks(other, expected):
    plans = [_plan([4, 8], [8]), _plan([4, 8], [8]), other]
    assert difference(plans, NAMES) == expected


def test_unknown_steps_on_every_worker_are_the_same_steps():
    plans = [_plan([4], steps=None), _plan([4], steps=None), _plan([4], steps=None)]
    assert difference(plans, NAMES) is None


def test_a_variable_alike_on_every_worker_differs_in_nothing_whatever_it_is_called():
    records = [["kernel", [4, 32], "float32"], ["dense_7/kernel", [4, 32], "float32"]]
    assert fit_agreement.variable_difference(records, ["worker:0", "worker:1"], 3) is None


def test_a_variable_that_differs_names_the_workers_of_each_shape_and_dtype():
    records = [
        ["kernel", [4, 32], "float32"],
        ["kernel", [4, 16], "float32"],
        ["kernel", [4, 32], "float32"],
        ["kernel", [4, 32], "float16"],
    ]
    names = ["chief:0", "worker:0", "worker:1", "worker:2"]
    assert fit_agreement.variable_difference(records, names, 5) == (
        "variable number 5 made in the strategy's scope is kernel [4, 32] float32 on chief:0 "
        "and worker:1, kernel [4, 16] float32 on worker:0, but kernel [4, 32] float16 on "
        "worker:2"
    )
