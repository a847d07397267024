"""What the fix for batches that do not split evenly costs (`uneven_batches_weighted_by_examples`).

Keras' `model.fit(x, y, batch_size=B)` on numpy arrays, and any dataset batched without
`drop_remainder=True`, gives the step a batch of unknown size: the fix then all-reduces each
replica's example count and reads the step's logs over all replicas (one `merge_call`). This
measures fit's examples/s with the fix on and with it removed (TFDIST_KERAS_FIXES=-name), the
same model and data, under multi_worker_mirrored (2 processes, loopback) and mirrored (2
virtual CPUs), at steps_per_execution 1 and 10. Both sides run in one job whose processes hold
both models, taking turns epoch by epoch (paired rounds); removing a fix is per process, so
the two sides are two jobs started together, and each epoch waits for its turn on a file.

Settings: MLP 64 -> 256 -> 256 -> 10, Adam, global batch 250 (125 per replica), 40 steps an
epoch, dataset batched without drop_remainder (the batch size is unknown to the step).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FIX = "uneven_batches_weighted_by_examples"
DEFAULT = {"rounds": 6, "steps": 150, "batch": 250, "hidden": 256}
QUICK = {"rounds": 2, "steps": 20, "batch": 250, "hidden": 256}
SIDES = ("on", "off")


def _turn(directory: str, side: str, epoch: int) -> None:
    common.wait_for_turn(directory, SIDES, side, epoch, timeout=600.0)


def _done(directory: str, side: str, epoch: int) -> None:
    common.end_turn(directory, SIDES, side, epoch, timeout=600.0)


def measure(strategy_name: str, side: str, directory: str, cfg: dict) -> list:
    """In each process of one side: examples/s of each timed epoch, at spe 1 then 10."""
    import numpy as np

    import tfdist

    if strategy_name == "mirrored":
        tfdist.virtual_cpus(2)
        strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    else:
        strategy = tfdist.make_strategy("multi_worker_mirrored")
    import keras
    import tensorflow as tf

    rng = np.random.RandomState(0)
    n = cfg["steps"] * cfg["batch"]
    x = rng.randn(n, 64).astype("float32")
    y = np.argmax(x @ rng.randn(64, 10), axis=1).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(cfg["batch"]).cache().repeat()
    results = {}
    for spe in (1, 10):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((64,)),
                    keras.layers.Dense(cfg["hidden"], activation="relu"),
                    keras.layers.Dense(cfg["hidden"], activation="relu"),
                    keras.layers.Dense(10, activation="softmax"),
                ]
            )
            model.compile(
                keras.optimizers.Adam(1e-3),
                "sparse_categorical_crossentropy",
                metrics=["accuracy"],
                steps_per_execution=spe,
            )
        model.fit(data, epochs=1, steps_per_epoch=cfg["steps"], verbose=0)  # tracing
        rates = []
        for epoch in range(cfg["rounds"]):
            key = spe * 1000 + epoch
            _turn(directory, side, key)
            started = time.perf_counter()
            model.fit(data, epochs=1, steps_per_epoch=cfg["steps"], verbose=0)
            rates.append(n / (time.perf_counter() - started))
            _done(directory, side, key)
        results[spe] = rates
    return results


def run(quick: bool = False, **overrides) -> list:
    import concurrent.futures

    cfg = dict(QUICK if quick else DEFAULT, **overrides)
    rows = []
    for strategy_name, workers in (("multi_worker_mirrored", 2), ("mirrored", 1)):
        with tempfile.TemporaryDirectory(prefix="tfdist-bench-uneven-") as directory:
            envs = {"on": {}, "off": {"TFDIST_KERAS_FIXES": f"-{FIX}"}}
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futures = {
                    side: pool.submit(
                        common.run_fresh,
                        measure,
                        workers=workers,
                        args=(strategy_name, side, directory, cfg),
                        env=dict(envs[side], TF_CPP_MIN_LOG_LEVEL="2"),
                        timeout=1200,
                    )
                    for side in SIDES
                }
                values = {side: future.result()[0] for side, future in futures.items()}
        for spe in (1, 10):
            rows.append(
                common.row(
                    f"fit, batch of unknown size, {strategy_name}, steps_per_execution={spe}",
                    values["on"][spe],
                    values["off"][spe],
                    f"without {FIX}",
                    "examples/s",
                    target=0.9,
                    notes="the fix's all-reduce of example counts and its exact logs, per step",
                    settings=cfg,
                )
            )
    return rows


if __name__ == "__main__":
    common.print_table(run(quick="--quick" in sys.argv))
