"""tfdist.precision, tier 3: multi_worker_mirrored and parameter_server on local clusters, and
tf_keras in a subprocess (the Keras flavour is fixed per process)."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import tfdist
from tfdist import precision

from helpers.precision import (
    EPOCHS,
    GLOBAL_BATCH,
    LEARNING_RATE,
    build_regression_model,
    close_losses,
    regression_data,
)

# ------------------------------------------------- tier 3: multi-worker and parameter-server


def multi_worker_precision_losses():
    """Each worker: float32, mixed_bfloat16 and mixed_float16 custom training loops
    (strategy.run, tfdist's loss-scaling helpers), the final loss on all the data. Keras 3
    fit() under multi_worker_mirrored needs tfdist's Keras fixes (tfdist.fit); this loop
    does not."""
    import keras
    import tensorflow as tf

    from tfdist.data import distribute_dataset

    strategy = tfdist.make_strategy()
    x, y = regression_data()
    global_batch = GLOBAL_BATCH
    losses = {}
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        keras.utils.set_random_seed(0)
        with precision.precision_scope(policy):
            with strategy.scope():
                model = build_regression_model(keras)
                optimizer = precision.wrap_optimizer(keras.optimizers.SGD(LEARNING_RATE))

            @tf.function
            def step(xb, yb):
                def replica(xb, yb):
                    with tf.GradientTape() as tape:
                        per_example = tf.square(model(xb, training=True) - yb)[:, 0]
                        loss = tf.nn.compute_average_loss(
                            per_example, global_batch_size=global_batch
                        )
                        scaled = precision.scale_loss(optimizer, loss)
                    grads = tape.gradient(scaled, model.trainable_variables)
                    precision.apply_gradients(optimizer, grads, model.trainable_variables)
                    return loss

                return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

            dataset = distribute_dataset((x, y), strategy, global_batch)
            for _ in range(EPOCHS):
                for xb, yb in dataset:
                    step(xb, yb)
            losses[policy] = float(np.mean((model(x).numpy() - y) ** 2))
            losses[policy + "_dtype"] = model.layers[0].compute_dtype
            losses[policy + "_optimizer"] = type(optimizer).__name__
    losses["replicas"] = strategy.num_replicas_in_sync
    return losses


@pytest.mark.slow
def test_mixed_precision_on_two_workers_reaches_the_float32_loss(run_cluster):
    runs = run_cluster(multi_worker_precision_losses, workers=2, timeout=150)
    first, second = runs["worker:0"].value, runs["worker:1"].value
    assert first == second  # the workers stayed in sync
    assert first["replicas"] == 2
    assert first["mixed_bfloat16_dtype"] == "bfloat16"
    assert first["float32"] < 0.25  # it learned (the variance of y is about 0.5)
    assert close_losses(first["float32"], first["mixed_bfloat16"]), first
    # mixed_float16: the loss is scaled once and the gradients unscaled once (a scale of
    # 32768 left in the gradients would diverge), with the skip decision agreed by both workers
    assert first["mixed_float16_optimizer"] == "LossScaleOptimizer"
    assert first["float32_optimizer"] == first["mixed_bfloat16_optimizer"] == "SGD"
    assert close_losses(first["float32"], first["mixed_float16"]), first


def parameter_server_precision_losses():
    """The chief of a parameter-server job: float32, mixed_bfloat16 and mixed_float16 trained
    by a plain ClusterCoordinator loop with tfdist's loss-scaling helpers (tfdist.fit has its
    own parameter-server loop, tested with it)."""
    import keras
    import tensorflow as tf

    from tfdist.data import dataset_fn_for

    strategy = tfdist.make_strategy()
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    x, y = regression_data()
    global_batch, steps = 32, 96  # to the plateau; steps are cheap here
    losses = {"strategy": type(strategy).__name__}
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        keras.utils.set_random_seed(0)
        with precision.precision_scope(policy):
            with strategy.scope():
                model = build_regression_model(keras)
                optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1))
                optimizer.build(model.trainable_variables)
            dataset = coordinator.create_per_worker_dataset(
                dataset_fn_for((x, y), global_batch, shuffle=True, seed=0, repeat=True)
            )
            iterator = iter(dataset)

            @tf.function
            def step(iterator):
                def replica(xb, yb):
                    with tf.GradientTape() as tape:
                        per_example = tf.square(model(xb, training=True) - yb)[:, 0]
                        loss = tf.nn.compute_average_loss(
                            per_example, global_batch_size=global_batch
                        )
                        scaled = precision.scale_loss(optimizer, loss)
                    grads = tape.gradient(scaled, model.trainable_variables)
                    precision.apply_gradients(optimizer, grads, model.trainable_variables)
                    return loss

                return strategy.run(replica, args=next(iterator))

            for _ in range(steps):
                coordinator.schedule(step, args=(iterator,))
            coordinator.join()
            losses[policy] = float(np.mean((model(x).numpy() - y) ** 2))
            losses[policy + "_dtype"] = model.layers[0].compute_dtype
            losses[policy + "_optimizer"] = type(optimizer).__name__
    return losses


@pytest.mark.slow
def test_mixed_precision_on_parameter_server_reaches_the_float32_loss(run_cluster):
    # One worker: its closures run one at a time, so both policies see the same updates in
    # the same order and the comparison measures precision only. With two workers the
    # asynchronous order (and staleness) varies from run to run.
    runs = run_cluster(parameter_server_precision_losses, workers=1, ps=1, timeout=180)
    result = runs["chief:0"].value
    assert result["strategy"] == "ParameterServerStrategyV2"
    assert result["mixed_bfloat16_dtype"] == "bfloat16"
    assert result["float32"] < 0.25
    assert close_losses(result["float32"], result["mixed_bfloat16"]), result
    assert result["mixed_float16_optimizer"] == "LossScaleOptimizer"  # scaled exactly once
    assert close_losses(result["float32"], result["mixed_float16"]), result


def parameter_server_fit_losses():
    """The chief of a 2-worker parameter-server job: float32, mixed_bfloat16 and mixed_float16
    trained by tfdist.fit (tfdist's own loop; Keras 3 wraps the LossScaleOptimizer in compile)
    to the plateau, where the asynchronous order of the steps no longer matters."""
    import keras

    strategy = tfdist.make_strategy()
    x, y = regression_data()
    losses = {"strategy": type(strategy).__name__, "workers": strategy.extended._num_workers}
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):

        def build():
            keras.utils.set_random_seed(0)
            model = build_regression_model(keras)
            schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
                [320, 480], [0.01, 0.002, 0.0005]
            )
            model.compile(
                optimizer=keras.optimizers.Adam(schedule), loss="mse", steps_per_execution=4
            )
            return model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mixed_float16 without a GPU warns: meant here
            with precision.precision_scope(policy):
                model = tfdist.fit(
                    build,
                    (x, y),
                    strategy=strategy,
                    global_batch_size=32,
                    epochs=16,
                    steps_per_epoch=40,
                    shuffle=True,
                    seed=0,
                    verbose=0,
                ).model
        losses[policy] = float(np.mean((model(x).numpy() - y) ** 2))
        losses[policy + "_dtype"] = model.layers[0].compute_dtype
        losses[policy + "_optimizer"] = type(model.optimizer).__name__
        # Keras before 3.10 counts the steps in the LossScaleOptimizer's inner optimizer only
        counting = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        losses[policy + "_iterations"] = int(counting.iterations.numpy())
    return losses


@pytest.mark.slow
def test_tfdist_fit_with_two_asynchronous_workers_reaches_the_plateau_in_every_policy(run_cluster):
    runs = run_cluster(parameter_server_fit_losses, workers=2, ps=1, timeout=300)
    result = runs["chief:0"].value
    assert result["strategy"] == "ParameterServerStrategyV2" and result["workers"] == 2
    # The plateau: near the noise floor (0.0025) of the data; the variance of y is about 0.5.
    # Two asynchronous workers apply their steps in no fixed order, so the final loss of one
    # policy varies from run to run (float32 0.008-0.010, mixed_bfloat16 0.008-0.014 in five
    # runs): each policy is held to the plateau float32 reaches, not to float32's run.
    assert result["float32"] < 0.02, result
    for policy, dtype in (("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")):
        assert result[policy + "_dtype"] == dtype
        assert result[policy + "_iterations"] == 16 * 40
        assert result[policy] < 0.02, result
    # scaled exactly once: Keras 3's compile wrapped the optimizer, tfdist's loop did not
    assert result["mixed_float16_optimizer"] == "LossScaleOptimizer"
    assert result["float32_optimizer"] == result["mixed_bfloat16_optimizer"] == "Adam"


# -------------------------------------------------------------------------- tf_keras


TF_KERAS_SCRIPT = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import tf_keras as keras
    from tfdist import flavour, precision
    from tfdist.learning_rate import scale_learning_rate

    out = {"flavour": flavour.keras_flavour()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["applied"] = precision.set_precision("mixed_float16")
    from tfdist.strategy import runtime_initialized
    out["initialised"] = runtime_initialized()  # so make_strategy() may still come after
    out["warned"] = [str(w.message)[:60] for w in caught]
    out["global"] = keras.mixed_precision.global_policy().name
    sgd = keras.optimizers.SGD(0.01)
    wrapped = precision.wrap_optimizer(sgd)
    out["wrapped"] = type(wrapped).__name__
    out["wrapped_once"] = precision.wrap_optimizer(wrapped) is wrapped

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    y[16:24] *= 1e7
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=wrapped, loss="mse")
    out["compile_kept_it"] = model.optimizer is wrapped
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    out["fit_finite"] = bool(all(np.isfinite(w).all() for w in model.get_weights()))

    import tensorflow as tf
    custom = precision.wrap_optimizer(keras.optimizers.SGD(0.01))
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                            keras.layers.Dense(1, dtype="float32")])
    for i in range(0, 64, 8):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(x[i:i + 8]) - y[i:i + 8]))
            scaled = precision.scale_loss(custom, loss)
        grads = tape.gradient(scaled, net.trainable_variables)
        precision.apply_gradients(custom, grads, net.trainable_variables)
    out["loop_finite"] = bool(all(np.isfinite(w).all() for w in net.get_weights()))
    out["loop_scale"] = float(custom.loss_scale)

    bad = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="head")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["bad_outputs"] = precision.check_model_outputs(bad)
    out["bad_warned"] = len(caught)
    with precision.precision_scope("float32"):
        out["scoped"] = keras.mixed_precision.global_policy().name
    out["restored"] = keras.mixed_precision.global_policy().name

    schedule = scale_learning_rate(0.1, 4, warmup_steps=10)
    out["schedule_type"] = isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
    out["lr"] = [float(schedule(s)) for s in (0, 5, 10, 100)]
    optimizer = keras.optimizers.SGD(schedule)
    out["optimizer_lr"] = float(optimizer.learning_rate)
    again = type(schedule).from_config(schedule.get_config())
    out["lr_again"] = float(again(5))
    print("RESULT " + json.dumps(out))
""")


def test_tf_keras_flavour_in_a_subprocess():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-c", TF_KERAS_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["flavour"] == "tf_keras"
    assert out["applied"] == out["global"] == "mixed_float16"
    assert out["initialised"] is False
    assert out["warned"] and "host without GPUs" in out["warned"][0]
    assert out["wrapped"].startswith("LossScaleOptimizer") and out["wrapped_once"]
    assert out["compile_kept_it"] and out["fit_finite"]
    assert out["loop_finite"] and out["loop_scale"] < 2.0**15
    assert out["bad_outputs"] == [["head", "float16"]] and out["bad_warned"] == 1
    assert out["scoped"] == "float32" and out["restored"] == "mixed_float16"
    assert out["schedule_type"]
    assert out["lr"] == pytest.approx([0.1, 0.25, 0.4, 0.4])
    assert out["optimizer_lr"] == pytest.approx(0.1)
    assert out["lr_again"] == pytest.approx(0.25)
