"""tfdist.precision: tier 1 (the "auto" rules, names, warnings), tier 2 (mirrored on the
logical CPUs), tier 3 (multi_worker_mirrored and parameter_server on local clusters), and
tf_keras in a subprocess (the Keras flavour is fixed per process)."""

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import tfdist
from tfdist import precision
from tfdist.precision import choose_policy

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


# ---------------------------------------------------------------- tier 1: the auto rules


@pytest.mark.parametrize(
    "gpus, flags, expected, reason",
    [
        ([(8, 0)], set(), "mixed_bfloat16", r"1 GPU\(s\), lowest compute capability 8\.0 >= 8\.0"),
        (
            [(9, 0), (8, 6)],
            {"avx2"},
            "mixed_bfloat16",
            r"2 GPU\(s\), lowest compute capability 8\.6",
        ),
        ([(7, 0)], set(), "mixed_float16", r"7\.0 >= 7\.0: float16 tensor cores"),
        ([(8, 0), (7, 5)], set(), "mixed_float16", r"lowest compute capability 7\.5"),
        ([(6, 1)], {"amx_bf16"}, "float32", r"6\.1 < 7\.0: no tensor cores"),  # GPUs decide
        ([(8, 0), None], set(), "float32", r"compute capability unknown"),
        ([], {"avx2", "fma"}, "float32", r"CPU only, without native bfloat16"),
        ([], {"avx512f", "avx512_bf16"}, "mixed_bfloat16", r"native bfloat16 \(avx512_bf16\)"),
        ([], {"amx_tile", "amx_bf16", "amx_int8"}, "mixed_bfloat16", r"\(amx_bf16\)"),
        ([], {"amx_tile"}, "float32", r"without native bfloat16"),
        ([], set(), "float32", r"without native bfloat16"),
    ],
)
def test_auto_rules_with_injected_devices(gpus, flags, expected, reason):
    policy, why = choose_policy(gpus, flags)
    assert policy == expected
    assert re.search(reason, why), why


def test_cpu_flags_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 AVX512_BF16 amx_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu avx2\n"
    )
    assert precision.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "AVX512_BF16", "amx_bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) == set()
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert choose_policy([], precision.cpu_flags(str(arm)))[0] == "mixed_bfloat16"


@pytest.mark.parametrize(
    "policy, error, match",
    [
        (
            "mixed_fp16",
            ValueError,
            r"policy='mixed_fp16' is not a known precision policy\. Choose "
            r"one of: auto, float32, mixed_float16, mixed_bfloat16",
        ),
        ("bf16-mixed", ValueError, r"policy='bf16-mixed' is not a known"),
        ("float16", ValueError, r"Choose one of"),
        (16, TypeError, r"must be a string\. Received: policy=16 \(of type int\)"),
    ],
)
def test_unknown_policy_names_are_refused_with_the_choices(policy, error, match):
    with pytest.raises(error, match=match):
        precision.set_precision(policy)


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


# Small enough to keep the tests quick: 256 examples, 4 steps an epoch, 5 epochs.
GLOBAL_BATCH, EPOCHS, LEARNING_RATE = 64, 5, 0.2


def regression_data(n=256):
    rng = np.random.default_rng(42)
    x = rng.normal(size=(n, 8)).astype("float32")
    w = rng.normal(size=(8, 1)).astype("float32")
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def build_regression_model(keras):
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def close_losses(a, b, tolerance=0.05):
    """Losses within `tolerance` (relative) of each other, plus a small absolute slack."""
    return abs(a - b) <= tolerance * max(a, b) + 0.005


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
def test_tfdist_fit_with_two_asynchronous_workers_reaches_the_float32_loss(run_cluster):
    runs = run_cluster(parameter_server_fit_losses, workers=2, ps=1, timeout=300)
    result = runs["chief:0"].value
    assert result["strategy"] == "ParameterServerStrategyV2" and result["workers"] == 2
    assert result["float32"] < 0.02  # near the noise floor (0.0025) of the data
    for policy, dtype in (("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")):
        assert result[policy + "_dtype"] == dtype
        assert result[policy + "_iterations"] == 16 * 40
        assert close_losses(result["float32"], result[policy]), result
    # scaled exactly once: Keras 3's compile wrapped the optimizer, tfdist's loop did not
    assert result["mixed_float16_optimizer"] == "LossScaleOptimizer"
    assert result["float32_optimizer"] == result["mixed_bfloat16_optimizer"] == "Adam"


# -------------------------------------------------------------------------- tf_keras


TF_KERAS_SCRIPT = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import tf_keras as keras
    from tfdist import flavour, precision
    from tfdist.data import scale_learning_rate

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
