"""Parameter-server training (tfdist.parameter_server): the checks of the dataset function and
of the strategy (they look at TensorFlow's types)."""

import pytest

from tfdist.parameter_server import evaluate_parameter_server, fit_parameter_server

from helpers.parameter_server import _dataset_fn


def test_fit_and_evaluate_need_a_dataset_function_and_a_parameter_server_strategy():
    with pytest.raises(
        TypeError,
        match=r"`dataset_fn` must be a function of a "
        r"tf.distribute.InputContext",
    ):
        fit_parameter_server(object(), object(), [1, 2], steps_per_epoch=5)
    with pytest.raises(
        TypeError,
        match=r"needs a tf.distribute.ParameterServerStrategy .*"
        r"Received: strategy='mirrored' \(of type str\)",
    ):
        evaluate_parameter_server(object(), "mirrored", _dataset_fn, steps=5)
    with pytest.raises(ValueError, match=r"Received: steps=None"):
        evaluate_parameter_server(object(), object(), _dataset_fn, steps=None)
