"""Parameter-server training (tfdist.parameter_server) without TensorFlow: the step plan and
the argument checks made before anything runs."""

import pytest

from tfdist.parameter_server import fit_parameter_server, plan_groups

from helpers.parameter_server import _dataset_fn

# --------------------------------------------------------------------------- step planning


@pytest.mark.parametrize(
    "steps, k, groups",
    [
        (1, 1, [(0, 0)]),
        (3, 1, [(0, 0), (1, 1), (2, 2)]),
        (6, 3, [(0, 2), (3, 5)]),
        (7, 3, [(0, 2), (3, 5), (6, 6)]),
        (10, 4, [(0, 3), (4, 7), (8, 9)]),
        (2, 5, [(0, 1)]),
    ],
)
def test_plan_groups_covers_every_step_once_with_a_shorter_last_group(steps, k, groups):
    assert plan_groups(steps, k) == groups
    covered = [s for begin, end in groups for s in range(begin, end + 1)]
    assert covered == list(range(steps))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(steps_per_epoch=0),
            r"`steps_per_epoch` must be a positive integer. Received: "
            r"steps_per_epoch=0",
        ),
        (dict(steps_per_epoch=True), r"Received: steps_per_epoch=True"),
        (
            dict(steps_per_epoch=5, epochs=-1),
            r"`epochs` must be an integer >= 0. Received: "
            r"epochs=-1",
        ),
        (dict(steps_per_epoch=5, steps_per_execution=0), r"Received: steps_per_execution=0"),
        (
            dict(steps_per_epoch=5, validation_dataset_fn=_dataset_fn),
            r"`validation_steps` is required with `validation_dataset_fn`",
        ),
    ],
)
def test_fit_rejects_bad_counts_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fit_parameter_server(object(), object(), _dataset_fn, **kwargs)
