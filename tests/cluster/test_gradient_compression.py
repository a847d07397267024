"""Tier 3: gradient compression (bf16, fp16) leaves training where no compression takes it.

One 2-process multi_worker_mirrored job trains two real small tasks (sklearn's digits
classifier, and a regression on sklearn's diabetes data) from several seeds with each
compression, and compares the losses after the same steps; the same job checks a custom loop's
step exactly and `tfdist.fit`. Under tf_keras: a job of its own. Mirrored:
tests/inprocess/test_compression_mirrored.py.
"""

import pytest

from helpers.compression import (
    NOT_BFLOAT16,
    OVER_FLOAT16,
    build_digits_classifier,
    digits,
    one_step,
    within_one_percent,
)

pytestmark = pytest.mark.slow

SEEDS = (0, 1, 2)
MODES = (None, "bf16", "fp16")
STEPS = 40


def _tasks():
    import numpy as np
    from sklearn.datasets import load_diabetes

    x, y = digits()
    diabetes = load_diabetes()
    xr = diabetes.data.astype("float32")
    xr = (xr - xr.mean(0)) / xr.std(0)
    yr = diabetes.target.astype("float32")
    yr = ((yr - yr.mean()) / yr.std()).reshape(-1, 1)
    return {
        "digits": (x, y, 10, "sparse_categorical_crossentropy"),
        "diabetes": (xr, yr, 1, "mse"),
    }, np


def compressed_training():
    """In each worker: {task: {seed: {mode: final loss}}}, and what the strategy reports."""
    import keras
    import tensorflow as tf

    import tfdist
    from tfdist.strategy.compression import compress_multi_worker, compression_of

    strategy = tfdist.make_strategy(gradient_compression="bf16")
    reported = compression_of(strategy)
    sums = {}
    for mode in MODES:
        compress_multi_worker(strategy, mode)
        # 72 MB: all-reduced in 16 MiB pieces (tfdist's default on the ring), the last one short;
        # 40960 per replica (exact in both types): a float16 sum would overflow (65504)
        # without fp16's prescaling
        sums[str(mode)] = [
            _sum_ends(tf, strategy, 18_000_003, 1.5),
            _sum_ends(tf, strategy, 4096, 40960.0),
        ]
    tasks, np = _tasks()
    digits_x, digits_y = tasks["digits"][:2]
    losses = {}
    for name, (x, y, outputs, loss) in tasks.items():
        for seed in SEEDS:
            for mode in MODES:
                # the same strategy reduces with each compression in turn (one job for all)
                compress_multi_worker(strategy, mode)
                keras.utils.set_random_seed(seed)
                with strategy.scope():
                    model = keras.Sequential(
                        [
                            keras.Input((x.shape[1],)),
                            keras.layers.Dense(128, activation="relu"),
                            keras.layers.Dense(128, activation="relu"),
                            keras.layers.Dense(
                                outputs, activation="softmax" if outputs > 1 else None
                            ),
                        ]
                    )
                    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
                order = np.random.RandomState(seed).permutation(len(x))
                data = (
                    tf.data.Dataset.from_tensor_slices((x[order], y[order]))
                    .repeat()
                    .batch(64, drop_remainder=True)
                )
                history = model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
                losses.setdefault(name, {}).setdefault(seed, {})[str(mode)] = float(
                    history.history["loss"][-1]
                )
    # a custom loop's step, and tfdist.fit (the digits classifier, seed 0)
    steps, fitted = {}, {}
    for mode in MODES:
        compress_multi_worker(strategy, mode)
        steps[str(mode)] = one_step(keras, tf, strategy, NOT_BFLOAT16)
        history = tfdist.fit(
            lambda: build_digits_classifier(keras, seed=0),
            (digits_x, digits_y),
            strategy=strategy,
            global_batch_size=64,
            steps_per_epoch=STEPS,
            verbose=0,
        )
        fitted[str(mode)] = float(history.history["loss"][-1])
    compress_multi_worker(strategy, "fp16")
    steps["fp16 past float16"] = one_step(keras, tf, strategy, OVER_FLOAT16)
    return {"reported": reported, "losses": losses, "sums": sums, "steps": steps, "fit": fitted}


def _sum_ends(tf, strategy, size, fill):
    """The first plus the last element of the all-reduced tf.fill([size], fill)."""

    @tf.function
    def step():
        def replica():
            total = tf.distribute.get_replica_context().all_reduce("SUM", tf.fill([size], fill))
            return total[0] + total[-1]

        return strategy.run(replica)

    return float(strategy.experimental_local_results(step())[0])


def test_bf16_and_fp16_compression_keep_the_loss_within_one_percent(run_cluster):
    runs = run_cluster(compressed_training, workers=2, timeout=600)
    results = [runs[f"worker:{i}"].value for i in range(2)]
    assert [r["reported"] for r in results] == ["bf16", "bf16"]
    assert results[0]["losses"] == results[1]["losses"]  # the workers agree exactly
    for mode in ("None", "bf16", "fp16"):  # exact sums: in pieces, and no fp16 overflow
        assert results[0]["sums"][mode] == [6.0, 163840.0], (mode, results[0]["sums"])
    problems = []
    for name, seeds in results[0]["losses"].items():
        for seed, by_mode in seeds.items():
            base = by_mode["None"]
            for mode in ("bf16", "fp16"):
                change = abs(by_mode[mode] - base) / base
                if change > 0.01:
                    problems.append(f"{name} seed {seed} {mode}: {by_mode[mode]} vs {base}")
    assert not problems, problems
    changed = [
        by_mode[mode] != by_mode["None"]
        for seeds in results[0]["losses"].values()
        for by_mode in seeds.values()
        for mode in ("bf16", "fp16")
    ]
    assert any(changed), "the compressed runs equal the uncompressed ones: nothing was cast"
    # a custom loop: bfloat16 rounds each worker's (1 + 2**-10) / 2 to 1/2; float16 holds it,
    # and its prescaling keeps a sum past 65504 finite
    assert results[0]["steps"] == {
        "None": -NOT_BFLOAT16,
        "bf16": -1.0,
        "fp16": -NOT_BFLOAT16,
        "fp16 past float16": -OVER_FLOAT16,
    }
    assert not within_one_percent(results[0]["fit"]), results[0]["fit"]  # tfdist.fit


def legacy_compressed_training():
    """The digits classifier under tf_keras (TF_USE_LEGACY_KERAS=1): {mode: final loss}."""
    import tensorflow as tf

    import tfdist
    from tfdist.strategy.compression import compress_multi_worker

    strategy = tfdist.make_strategy(gradient_compression="fp16")
    tasks, _ = _tasks()
    x, y = tasks["digits"][:2]
    losses = {}
    for mode in MODES:
        compress_multi_worker(strategy, mode)
        with strategy.scope():
            model = build_digits_classifier(tf.keras, seed=0)
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64, drop_remainder=True)
        history = model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
        losses[str(mode)] = float(history.history["loss"][-1])
    return {"module": type(model).__module__, "losses": losses}


def test_compression_under_tf_keras_keeps_the_loss_within_one_percent(run_cluster):
    runs = run_cluster(
        legacy_compressed_training, workers=2, timeout=600, env={"TF_USE_LEGACY_KERAS": "1"}
    )
    result = runs["worker:0"].value
    assert result["module"].startswith("tf_keras"), result["module"]
    losses = result["losses"]
    for mode in ("bf16", "fp16"):
        assert abs(losses[mode] - losses["None"]) / losses["None"] <= 0.01, losses
    assert losses["bf16"] != losses["None"], losses  # the casts happened
