"""What tfdist's Horovod API costs against the strategy it stands beside (`tfdist.horovod`).

1. All-reduce throughput: `hvd.allreduce(t, op=hvd.Sum)` of a float32 tensor of 1, 16 and 128
   MiB, against the same sum through MultiWorkerMirroredStrategy's own collective
   (`replica_context.all_reduce` in `strategy.run`, the strategy from `tfdist.make_strategy()`),
   both inside a tf.function, 2 processes on loopback. Algorithm bandwidth = bytes of the
   tensor / seconds per all-reduce.
2. Keras fit: `model.fit` with `hvd.DistributedOptimizer` (each process its shard, batch
   B / 2) against the same model compiled in `make_strategy()`'s scope (global batch B), 2
   processes: examples/s of the job.

Each side is its own 2-process job (a process configures TensorFlow's collectives once, for
one of the two); both jobs run at once and take turns round by round (paired rounds).
Settings: MLP 256 -> 1024 -> 1024 -> 10 (2.3M parameters), SGD, global batch 256, 30 steps an
epoch.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DEFAULT = {"rounds": 7, "reps": {1: 40, 16: 8, 128: 2}, "steps": 30, "batch": 256}
QUICK = {"rounds": 3, "reps": {1: 10, 16: 3, 128: 1}, "steps": 10, "batch": 256}
SIDES = ("horovod", "strategy")
MIB = 1 << 20


def _turn(directory, side, key):
    common.wait_for_turn(directory, SIDES, side, key)


def _done(directory, side, key):
    common.end_turn(directory, SIDES, side, key)


def _model(keras):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def measure(side: str, directory: str, cfg: dict) -> dict:
    """In each process of one side: all-reduce GB/s per size and fit examples/s, per round."""
    import numpy as np

    if side == "horovod":
        import tfdist.horovod.tensorflow.keras as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        import tensorflow as tf

        def reduce_fn(t):
            return hvd.allreduce(t, op=hvd.Sum)

        scope = None
    else:
        import tfdist

        strategy = tfdist.make_strategy("multi_worker_mirrored")
        rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
        device = strategy.extended.worker_devices[0]
        import tensorflow as tf

        def reduce_fn(t):
            def step(value):
                ctx = tf.distribute.get_replica_context()
                with tf.device(device):  # all_reduce reduces to the value's device
                    value = tf.identity(value)
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

            return strategy.experimental_local_results(strategy.run(step, args=(t,)))[0]

        scope = strategy.scope
    import keras

    out = {"allreduce": {}, "fit": []}
    reduce_graph = tf.function(reduce_fn)
    for mib, reps in cfg["reps"].items():
        t = tf.ones([mib * MIB // 4], tf.float32)
        reduce_graph(t).numpy()  # trace and warm
        samples = []
        for r in range(cfg["rounds"]):
            key = f"a{mib}-{r}"
            _turn(directory, side, key)
            started = time.perf_counter()
            for _ in range(reps):
                result = reduce_graph(t)
            result.numpy()
            samples.append(mib * MIB * reps / (time.perf_counter() - started) / 1e9)
            _done(directory, side, key)
        out["allreduce"][mib] = samples

    rng = np.random.RandomState(0)
    n = cfg["steps"] * cfg["batch"]
    x = rng.randn(n, 256).astype("float32")
    y = rng.randint(0, 10, size=n).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if scope is None:
        data = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size]))
        data = data.batch(cfg["batch"] // size).cache().repeat()
        model = _model(keras)
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss)
    else:
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(cfg["batch"]).cache().repeat()
        with scope():
            model = _model(keras)
            model.compile(keras.optimizers.SGD(0.01), loss)
    model.fit(data, epochs=1, steps_per_epoch=cfg["steps"], verbose=0)  # tracing
    for r in range(cfg["rounds"]):
        key = f"f-{r}"
        _turn(directory, side, key)
        started = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=cfg["steps"], verbose=0)
        out["fit"].append(n / (time.perf_counter() - started))
        _done(directory, side, key)
    return out


def run(quick: bool = False, **overrides) -> list:
    import concurrent.futures

    cfg = dict(QUICK if quick else DEFAULT, **overrides)
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-horovod-") as directory:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {
                side: pool.submit(
                    common.run_fresh,
                    measure,
                    workers=2,
                    args=(side, directory, cfg),
                    env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                    timeout=2400,
                )
                for side in SIDES
            }
            values = {side: future.result()[0] for side, future in futures.items()}
    rows = []
    for mib in cfg["reps"]:
        rows.append(
            common.row(
                f"hvd.allreduce {mib} MiB float32, 2 processes",
                values["horovod"]["allreduce"][mib],
                values["strategy"]["allreduce"][mib],
                "multi_worker_mirrored all_reduce",
                "GB/s",
                target=0.95,
                notes="algorithm bandwidth: tensor bytes / seconds per all-reduce",
                settings=cfg,
            )
        )
    rows.append(
        common.row(
            "fit with hvd.DistributedOptimizer, 2 processes",
            values["horovod"]["fit"],
            values["strategy"]["fit"],
            "fit under make_strategy()",
            "examples/s",
            target=0.95,
            notes="MLP 256-1024-1024-10, SGD, global batch 256",
            settings=cfg,
        )
    )
    return rows


if __name__ == "__main__":
    common.print_table(run(quick="--quick" in sys.argv))
