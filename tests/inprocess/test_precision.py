"""tfdist.precision, tier 2: applying policies, the warnings, loss scaling, and mirrored on the
logical CPUs. Tier 1 (the "auto" rules, names): tests/unit/test_precision_rules.py; tier 3
(multi_worker_mirrored and parameter_server on local clusters, tf_keras in a subprocess):
tests/cluster/test_precision_jobs.py."""

import logging
import warnings

import numpy as np
import pytest

import tfdist
from tfdist import precision
from tfdist.precision import choose_policy

from helpers.precision import (
    EPOCHS,
    GLOBAL_BATCH,
    LEARNING_RATE,
    build_regression_model,
    close_losses,
    regression_data,
)
from helpers.task import no_task_set  # noqa: F401  (autouse: the chief-only messages read it)

SINGLE = tfdist.ClusterSpec({})


@pytest.fixture(autouse=True)
def _fresh_precision_state():
    """Each test starts from float32 and an empty "already logged / warned" set."""
    import keras

    precision._ONCE.clear()
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
    precision._ONCE.clear()


@pytest.mark.parametrize(
    "gpus, flags, expected",
    [
        ([(8, 6)], set(), "mixed_bfloat16"),
        ([(7, 5)], set(), "mixed_float16"),
        ([], {"avx2"}, "float32"),
        ([], {"amx_bf16"}, "mixed_bfloat16"),
    ],
)
def test_set_precision_auto_applies_the_choice(monkeypatch, gpus, flags, expected):
    import keras

    monkeypatch.setattr(precision, "gpu_capabilities", lambda devices=None: gpus)
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mixed_float16 "on a GPU" is fine; nothing to check
        assert precision.set_precision("auto") == expected
    assert keras.mixed_precision.global_policy().name == expected
    assert precision.auto_precision()["policy"] == expected


def test_this_host_has_no_gpu_and_explicit_cpu_devices_mean_cpu_rules():
    assert precision.gpu_capabilities() == []
    assert precision.gpu_capabilities(["/cpu:0", "/cpu:1"]) == []
    report = precision.auto_precision()
    assert report["policy"] == choose_policy([], precision.cpu_flags())[0]
    assert set(report) == {"policy", "reason", "gpu_capabilities", "cpu_bf16_flags"}


def test_names_are_applied_verbatim_and_the_choice_is_logged_once(caplog):
    import keras

    caplog.set_level(logging.INFO, logger="tfdist")
    assert precision.set_precision("Mixed_BFloat16") == "mixed_bfloat16"
    assert precision.set_precision("mixed_bfloat16") == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert keras.layers.Dense(2).compute_dtype == "bfloat16"
    logged = [r.getMessage() for r in caplog.records if "precision policy" in r.getMessage()]
    assert logged == ["tfdist: precision policy 'mixed_bfloat16' (requested)."]


def test_only_the_chief_logs_and_warns(monkeypatch, caplog):
    worker1 = tfdist.ClusterSpec.local(workers=2, task_type="worker", task_index=1)
    monkeypatch.setenv("TF_CONFIG", worker1.to_json())
    caplog.set_level(logging.INFO, logger="tfdist")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert precision.set_precision("mixed_float16") == "mixed_float16"
    assert not caught
    assert not [r for r in caplog.records if "precision" in r.getMessage()]


def test_mixed_float16_without_a_gpu_warns_once_and_explains_the_cost():
    with pytest.warns(
        UserWarning,
        match=r"'mixed_float16' on a host without GPUs: CPUs have no "
        r"fast float16 arithmetic.*Expect no speed-up over float32 \(often a "
        r"slowdown\).*HINT: use 'float32' or 'auto'",
    ) as record:
        precision.set_precision("mixed_float16")
    assert record[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision.set_precision("mixed_float16")
    assert not caught


def test_precision_scope_restores_the_previous_policy_even_on_error():
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    with pytest.raises(RuntimeError, match="boom"):
        with precision.precision_scope("float32") as name:
            assert name == "float32"
            assert keras.mixed_precision.global_policy().name == "float32"
            raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_check_model_outputs_warns_about_16_bit_outputs():
    import keras

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision.set_precision("mixed_float16")
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inputs)
    bad = keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden), name="bad")
    good = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(hidden))
    with pytest.warns(
        UserWarning,
        match=r"Model 'bad' under precision 'mixed_float16' outputs "
        r"16-bit floats: head \(float16\).*HINT: give the last layer "
        r"dtype='float32'",
    ):
        assert precision.check_model_outputs(bad) == [("head", "float16")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert precision.check_model_outputs(bad) == [("head", "float16")]  # warned once
        assert precision.check_model_outputs(good) == []
    assert not caught
    keras.mixed_precision.set_global_policy("float32")
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert precision.check_model_outputs(plain) == []


# ------------------------------------------------------------------- loss scaling, once


def test_wrap_optimizer_wraps_only_for_mixed_float16_and_never_twice():
    import keras

    sgd = keras.optimizers.SGD(0.1)
    assert precision.wrap_optimizer(sgd) is sgd  # float32
    assert precision.wrap_optimizer(sgd, policy="mixed_bfloat16") is sgd
    wrapped = precision.wrap_optimizer(sgd, policy="mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.inner_optimizer is sgd
    assert precision.wrap_optimizer(wrapped, policy="mixed_float16") is wrapped
    assert isinstance(
        precision.wrap_optimizer("adam", policy="mixed_float16"),
        keras.optimizers.LossScaleOptimizer,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision.set_precision("mixed_float16")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=wrapped, loss="mse")  # compile must not wrap it again
    assert model.optimizer is wrapped
    assert not isinstance(model.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="float32")])
    other.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")  # Keras 3 wraps it itself
    assert isinstance(other.optimizer, keras.optimizers.LossScaleOptimizer)
    assert precision.wrap_optimizer(other.optimizer) is other.optimizer


def overflow_data():
    """Regression data with one batch of huge targets: the float16 gradients of that batch
    overflow (they exceed 65504) even without any loss scale."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    y[16:24] *= 1e7
    clean = np.r_[0:16, 24:64]
    return x, y, clean


def _overflow_model(keras):
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1, dtype="float32")]
    )


@pytest.mark.parametrize("auto_scale_loss", [False, True])
def test_mixed_float16_loss_scaling_trains_without_nan_where_plain_float16_overflows(
    auto_scale_loss,
):
    import keras

    x, y, clean = overflow_data()
    keras.utils.set_random_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with precision.precision_scope("mixed_float16"):
            model = _overflow_model(keras)
            model.compile(
                optimizer=keras.optimizers.SGD(0.01), loss="mse", auto_scale_loss=auto_scale_loss
            )
            before = model.evaluate(x[clean], y[clean], verbose=0)
            model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
            after = model.evaluate(x[clean], y[clean], verbose=0)
    finite = all(np.isfinite(w).all() for w in model.get_weights())
    if auto_scale_loss:  # Keras 3's own LossScaleOptimizer: the overflowing step is skipped
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert finite and np.isfinite(after) and after < before
    else:  # without loss scaling the inf gradient reaches the weights
        assert not finite and np.isnan(after)


def disagreement_data():
    """With a global batch of 16 on 4 replicas: in the first step replicas 1..3 overflow and
    replica 0 does not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    y[4:16] *= 1e7
    return x, y


def _custom_loop(strategy, global_batch, x, y, epochs=1):
    """mixed_float16 custom loop with tfdist's helpers; returns (weights finite, scale)."""
    import keras
    import tensorflow as tf

    from tfdist.data import distribute_dataset

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = _overflow_model(keras)
        optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.01))
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    @tf.function
    def step(xb, yb):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.square(model(xb, training=True) - yb)[:, 0]
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                scaled = precision.scale_loss(optimizer, loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            precision.apply_gradients(optimizer, grads, model.trainable_variables)
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

    dataset = distribute_dataset((x, y), strategy, global_batch)
    for _ in range(epochs):
        for xb, yb in dataset:
            step(xb, yb)
    finite = all(np.isfinite(w).all() for w in model.get_weights())
    return finite, float(optimizer.dynamic_scale.numpy())


def test_custom_loop_loss_scaling_when_replicas_disagree(virtual_cpus):
    """Keras 3's LossScaleOptimizer decides "skip this step" per replica, from gradients not
    yet all-reduced: when replica 0 is finite and the others overflow, inf reaches every
    weight (this test fails that way with
    TFDIST_KERAS_FIXES=-loss_scale_skip_agreed_by_all_replicas). `precision.apply_gradients`
    relies on that fix, so the step is skipped."""
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    assert strategy.num_replicas_in_sync == 4
    x, y = disagreement_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with precision.precision_scope("mixed_float16"):
            finite, scale = _custom_loop(strategy, 16, x, y)
    assert finite
    assert scale < 2.0**15  # the overflowing step was skipped and the scale lowered


# ------------------------------------------------------ mixed_bfloat16 vs float32 training


def test_mixed_bfloat16_on_mirrored_reaches_the_float32_loss(virtual_cpus):
    import keras

    from tfdist.data import distribute_dataset

    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    x, y = regression_data()
    losses, dtypes = {}, {}
    for policy in ("float32", "mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with precision.precision_scope(policy):
                with strategy.scope():
                    model = build_regression_model(keras)
                    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss="mse")
                assert precision.check_model_outputs(model) == []
                history = model.fit(
                    distribute_dataset((x, y), strategy, GLOBAL_BATCH), epochs=EPOCHS, verbose=0
                )
        dtypes[policy] = model.layers[0].compute_dtype
        losses[policy] = float(np.mean((model(x).numpy() - y) ** 2))
        assert history.history["loss"][-1] < history.history["loss"][0] / 2  # it learned
    assert dtypes == {"float32": "float32", "mixed_bfloat16": "bfloat16"}
    assert close_losses(losses["float32"], losses["mixed_bfloat16"]), losses
