"""The plain Keras idiom under mirrored (4 virtual CPUs in this process).

Each scenario also runs, in fresh processes, with tfdist's Keras fixes turned off (to show
the upstream failure the fix removes) and on tf_keras (the same idiom must work there too).
"""

import concurrent.futures

import pytest

from tfdist import ClusterSpec, flavour, make_strategy
from tfdist.fixes.record import NOT_NEEDED
from tfdist.testing import run_cluster

from helpers import keras_scenarios as scenarios


@pytest.fixture(scope="module")
def strategy(virtual_cpus):
    return make_strategy("mirrored", cluster=ClusterSpec({}))


@pytest.fixture(scope="module")
def elsewhere():
    """The same scenarios without tfdist's fixes, and on tf_keras: two processes at once."""
    runs = {
        "no_fixes": {"TFDIST_KERAS_FIXES": "0"},
        "tf_keras": {"TF_USE_LEGACY_KERAS": "1"},
        # A fix whose bug the other fixes' absence hides (without the gradient sum of Keras
        # 3.3-3.4, no replica sees another's overflow): removed alone.
        "no_loss_scale_fix": {"TFDIST_KERAS_FIXES": "-loss_scale_skip_agreed_by_all_replicas"},
    }
    names = {
        "no_fixes": scenarios.MIRRORED,
        "tf_keras": [n for n in scenarios.MIRRORED if n not in scenarios.NOT_IN_TF_KERAS],
        "no_loss_scale_fix": ["loss_scale_disagreement"],
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            key: pool.submit(
                run_cluster,
                scenarios.in_subprocess_mirrored,
                workers=1,
                args=(names[key],),
                env=env,
                timeout=600,
            )
            for key, env in runs.items()
        }
        return {key: future.result()["worker:0"].value for key, future in futures.items()}


SYMBOLIC_BUILD = "symbolic_build_from_a_local_batch"
GRADIENTS_SUMMED = "gradients_summed_over_replicas"
LOSS_SCALED = "loss_scaled_for_replicas"


def ok(results, name):
    assert "ok" in results[name], results[name]["error"] + "\n" + results[name]["where"]
    return results[name]["ok"]


def fails_upstream(results, name, fix, *texts):
    scenarios.fails_upstream(results[name], fix, *texts)


def decreasing(losses):
    return losses[-1] < losses[0]


def test_validation_split_with_an_uneven_last_batch(strategy, elsewhere):
    result = scenarios.validation_split_uneven(strategy)
    assert decreasing(result["loss"]) and len(result["val_loss"]) == 3
    fails_upstream(
        elsewhere["no_fixes"],
        "validation_split_uneven",
        SYMBOLIC_BUILD,
        "Inputs to operation AddN of type AddN must have the same size and shape",
    )
    assert decreasing(ok(elsewhere["tf_keras"], "validation_split_uneven")["loss"])


def test_batches_that_do_not_split_over_the_replicas(strategy, elsewhere):
    result = scenarios.uneven_batches(strategy)
    assert decreasing(result["loss"]) and result["predict_shape"] == [70, 1]
    fails_upstream(
        elsewhere["no_fixes"], "uneven_batches", SYMBOLIC_BUILD, "AddN must have the same size"
    )
    # each replica's gradient weighed by its examples (uneven_batches_weighted_by_examples)
    assert result["loss"] == pytest.approx(result["one_device_loss"], rel=1e-5)
    # tf_keras weighs each replica's mean the same: it trains, a little differently
    tf_keras = ok(elsewhere["tf_keras"], "uneven_batches")
    assert decreasing(tf_keras["loss"])
    assert tf_keras["loss"] != pytest.approx(tf_keras["one_device_loss"], rel=1e-3)


def test_training_equals_one_device_training(strategy, elsewhere):
    result = scenarios.matches_one_device(strategy)
    assert result["moved"] > 0.05  # the weights did train ...
    assert result["max_weight_difference"] < 1e-5  # ... exactly as on one device
    assert ok(elsewhere["tf_keras"], "matches_one_device")["max_weight_difference"] < 1e-5
    upstream = ok(elsewhere["no_fixes"], "matches_one_device")["max_weight_difference"]
    if {scenarios.fix_state(GRADIENTS_SUMMED), scenarios.fix_state(LOSS_SCALED)} != {NOT_NEEDED}:
        assert upstream > 1e-3  # Keras before 3.8 trains differently under a strategy
    else:
        assert upstream < 1e-5


def test_string_inputs_through_string_lookup(strategy, elsewhere):
    result = scenarios.string_inputs(strategy)
    assert result["accuracy"] == 1.0
    assert result["predictions"][0] > 0.9 > 0.1 > result["predictions"][1]
    fails_upstream(
        elsewhere["no_fixes"],
        "string_inputs",
        SYMBOLIC_BUILD,
        "Value for attr 'T' of string is not in the list of allowed values",
    )
    assert ok(elsewhere["tf_keras"], "string_inputs")["accuracy"] == 1.0


def test_steps_per_execution(strategy, elsewhere):
    result = scenarios.steps_per_execution(strategy)
    assert ok(elsewhere["tf_keras"], "steps_per_execution")["max_weight_difference"] < 1e-6
    if result["one_device_iterations"] != 20:
        # n/a: Keras 3.3-3.6 unroll steps_per_execution and run extra steps at the end of an
        # epoch on one device too (here: the upstream count on one device), not tfdist's to fix.
        assert flavour.keras_version_tuple() < (3, 7)
        return
    assert result["iterations"] == 20
    assert result["max_weight_difference"] < 1e-6
    fails_upstream(
        elsewhere["no_fixes"], "steps_per_execution", SYMBOLIC_BUILD, "AddN must have the same size"
    )


def test_gradient_accumulation_matches_one_device(strategy, elsewhere):
    result = scenarios.gradient_accumulation(strategy)
    # 8 batches, an update every 2: Keras counts 4 steps (3.10 on) or 8 (before), as on one device
    assert result["iterations"] == result["one_device_iterations"] in (4, 8)
    assert result["moved"] > 0.01
    assert result["max_weight_difference"] < 1e-5
    fails_upstream(
        elsewhere["no_fixes"],
        "gradient_accumulation",
        "gradient_accumulation_under_a_strategy",
        "`merge_call` called while defining a new graph",
    )


def test_dropout_draws_a_different_mask_per_replica_reproducibly(strategy, elsewhere):
    result = scenarios.dropout_masks(strategy)
    assert (result["replicas"], result["distinct_masks"], result["reproducible"]) == (4, 4, True)
    assert ok(elsewhere["no_fixes"], "dropout_masks")["distinct_masks"] == 1  # upstream
    assert scenarios.fix_state("different_random_draws_per_replica") == "applied"
    assert ok(elsewhere["tf_keras"], "dropout_masks")["distinct_masks"] == 4


def test_sparse_embedding_gradients_and_jit_compile(strategy, elsewhere):
    result = scenarios.embedding_and_jit(strategy)
    assert decreasing(result["jit_False"]["loss"])
    assert result["jit_True"]["loss"] == pytest.approx(result["jit_False"]["loss"], rel=1e-5)
    assert result["jit_False"]["warnings"] == []
    assert "tfdist runs the step without XLA" in result["jit_True"]["warnings"][0]
    fails_upstream(
        elsewhere["no_fixes"], "embedding_and_jit", "no_xla_step_across_replicas", "InvalidArgument"
    )


def test_fit_evaluate_predict_dicts_and_sample_weights(strategy, elsewhere):
    result = scenarios.fit_evaluate_predict(strategy)
    for key in ("xy_loss", "weighted_loss", "dict_loss"):
        assert decreasing(result[key]), key
    assert result["predict_shape"] == [64, 1] and result["predict_matches_call"] < 1e-5
    tf_keras = ok(elsewhere["tf_keras"], "fit_evaluate_predict")
    assert result["xy_loss"] == pytest.approx(tf_keras["xy_loss"], rel=1e-4)


def test_optimizer_made_outside_the_scope_is_refused_with_the_fix(strategy, elsewhere):
    with pytest.raises(
        ValueError,
        match=r"The optimizer 'adam.*' was created outside the "
        r"strategy's scope.*HINT: create it inside the scope",
    ):
        scenarios.optimizer_made_outside_the_scope(strategy)
    fails_upstream(
        elsewhere["no_fixes"],
        "optimizer_made_outside_the_scope",
        "optimizer_made_outside_the_scope",
        "Mixing different tf.distribute.Strategy objects",
    )


def test_mixed_float16_skips_a_step_when_any_replica_overflows(strategy, elsewhere):
    assert scenarios.loss_scale_disagreement(strategy) == {"finite": True}
    assert ok(elsewhere["no_loss_scale_fix"], "loss_scale_disagreement") == {"finite": False}
