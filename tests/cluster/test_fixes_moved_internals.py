"""Applying the fixes on a release whose internals moved (tfdist.fixes).

In a fresh process, a target is removed or renamed, or Keras claims a newer version, and
`make_strategy` must still work, with one warning naming the fix and the consequence.
"""

import warnings

import pytest

from tfdist import fixes
from tfdist.fixes.record import APPLIED, NOT_NEEDED, SKIPPED
from tfdist.testing import run_cluster

# ------------------------------------------------- tier 3: a release whose internals moved


def moved_internals(change):
    """In a fresh process: change Keras as a new release might, then make_strategy."""
    import keras

    import tfdist

    if change == "removed":  # a target gone
        from keras.src.optimizers import loss_scale_optimizer

        del loss_scale_optimizer.LossScaleOptimizer.check_finite
    elif change == "renamed_params":  # a target whose parameters changed
        from keras.src.backend.tensorflow import optimizer

        original = optimizer.TFOptimizer.build

        def build(self, var_list):  # the same method, its parameter renamed
            return original(self, var_list)

        optimizer.TFOptimizer.build = build
    elif change == "newer":
        keras.__version__ = "3.99.0"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tfdist.virtual_cpus(2)
        strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
        tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))  # warned once only
    import numpy as np

    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.ones((10, 3), "float32")
    history = model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
    return {
        "warnings": [str(w.message) for w in caught if w.category is fixes.CompatibilityWarning],
        "report": {s.name: (s.state, s.reason) for s in fixes.report()},
        "loss": history.history["loss"],
    }


@pytest.fixture(scope="module")
def moved():
    changes = ("removed", "renamed_params", "newer")
    jobs = {c: run_cluster(moved_internals, workers=1, args=(c,), timeout=300) for c in changes}
    return {c: job["worker:0"].value for c, job in jobs.items()}


@pytest.mark.slow
def test_a_missing_target_skips_its_fix_with_one_warning_and_make_strategy_works(moved):
    result = moved["removed"]
    state, reason = result["report"]["loss_scale_skip_agreed_by_all_replicas"]
    assert state == SKIPPED and "check_finite is missing" in reason
    (warning,) = [w for w in result["warnings"] if "loss_scale_skip" in w]
    assert "tfdist skips its fix 'loss_scale_skip_agreed_by_all_replicas' on Keras " in warning
    assert "Consequence: under mixed_float16 with several replicas" in warning
    assert result["report"]["symbolic_build_from_a_local_batch"][0] in (APPLIED, NOT_NEEDED)
    assert len(result["loss"]) == 1


@pytest.mark.slow
def test_a_target_with_other_parameters_is_not_patched(moved):
    state, reason = moved["renamed_params"]["report"]["optimizer_made_outside_the_scope"]
    assert state == SKIPPED and "takes (self, var_list), the fix expects (self, variables" in reason


@pytest.mark.slow
def test_a_newer_keras_warns_once_and_applies_the_fixes_whose_targets_match(moved):
    result = moved["newer"]
    newer = [w for w in result["warnings"] if "newer than the releases tfdist was tested" in w]
    assert len(newer) == 1 and "Keras 3.99.0" in newer[0]
    states = {name: state for name, (state, _) in result["report"].items()}
    assert states["symbolic_build_from_a_local_batch"] == APPLIED
    assert states["multi_worker_steps_per_execution"] == APPLIED
    assert SKIPPED not in states.values()
