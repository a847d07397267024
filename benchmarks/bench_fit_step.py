"""The fixed cost of a Keras `fit` step under multi_worker_mirrored and mirrored.

One job (2 processes on loopback for multi_worker_mirrored; one process on 2 virtual CPUs for
mirrored) trains the same MLP (32 -> width -> width -> 10, global batch 64, SGD) in variants
that take turns, round after round, each for `steps` steps per round:

- fit: `model.fit(steps_per_epoch=steps, verbose=0)` with an accuracy metric, on a strategy
  from `tfdist.make_strategy` (tfdist's fixes on): what a user runs. Keras 3 in one job, tf_keras
  (TF_USE_LEGACY_KERAS=1) in another job of its own, each against its own loop.
- tfdist.fit (Keras 3 job): `tfdist.fit(build_model, data, steps_per_epoch=steps)`, with a
  `build_model` that returns the one compiled model (so a round measures the training, not
  the building).
- train function: the same model's compiled `model.train_function`, called `steps` times on
  one distributed iterator: Keras' step without fit's loop and callbacks.
- loop + loss: a hand-written step (`strategy.run` of a GradientTape step and
  `apply_gradients`, one `tf.function` call per step) that also all-reduces the loss each step
  (`strategy.reduce`), as the tf.distribute tutorials do.
- gradients only: the same hand-written step without the loss all-reduce: the least a
  synchronous step can do, the reference of every ratio.

Rows: steps/s of fit, tfdist.fit and the train function against the gradients-only loop of
the same job, medians over
rounds (each round runs all four within seconds of each other, in a rotating order), for a
small model (width 64: the step is mostly fixed cost) and a wide one (width 1,024); and fit's
CPU ms per step against the loop's. On a 2-core host a round of fit of the wide model
sometimes takes twice its usual wall time with the same CPU time (threads waiting, while the
other variants' iterators stay alive between rounds; fit alone does not show it): read the
min-max columns, and the CPU row, with that in mind.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FLAVOURS = ("keras3", "tf_keras")
DEFAULT = dict(steps=240, rounds=7, widths=(64, 1024), global_batch=64, timeout=900)
QUICK = dict(DEFAULT, steps=60, rounds=3, widths=(64,), timeout=600)
TARGET = 0.9  # fit / gradients-only loop


def measure(strategy_name: str, width: int, cfg: dict) -> dict:
    """In each process of the job: {variant: [steps/s per round]}."""
    import tfdist
    from tfdist import flavour

    if strategy_name == "mirrored":
        tfdist.virtual_cpus(2)
    strategy = tfdist.make_strategy(strategy_name)
    import tensorflow as tf

    runs = _variants(tf, flavour.keras(), strategy, width, cfg)
    for run in runs.values():  # warm-up: tracing
        run()
    variants = tuple(runs)
    rates = {name: [] for name in variants}
    cpu = {name: [] for name in variants}  # this process's CPU ms per step
    for round_ in range(cfg["rounds"]):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for name in order:
            started, cpu_started = time.perf_counter(), time.process_time()
            runs[name]()
            rates[name].append(cfg["steps"] / (time.perf_counter() - started))
            cpu[name].append((time.process_time() - cpu_started) * 1000 / cfg["steps"])
    return {"rates": rates, "cpu": cpu}


def _dataset(tf, batch: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * 16, 32)).astype("float32")
    y = rng.integers(0, 10, batch * 16).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return data.cache().repeat().with_options(options)


def _variants(tf, keras, strategy, width: int, cfg: dict) -> dict:
    """{variant: a function that runs `steps` steps of it}."""
    from tfdist import flavour

    batch, steps = cfg["global_batch"], cfg["steps"]
    data = _dataset(tf, batch)

    def model():
        return keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    with strategy.scope():
        fitted = model()
        fitted.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        looped, optimizer = model(), keras.optimizers.SGD(0.01)
        optimizer.build(looped.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step(x, y):
        with tf.GradientTape() as tape:
            predictions = looped(x, training=True)
            loss = tf.nn.compute_average_loss(per_example(y, predictions), global_batch_size=batch)
        gradients = tape.gradient(loss, looped.trainable_variables)
        optimizer.apply_gradients(zip(gradients, looped.trainable_variables))
        return loss

    @tf.function
    def gradients_only(iterator):
        strategy.run(step, args=next(iterator))

    @tf.function
    def loop_and_loss(iterator):
        return strategy.reduce("SUM", strategy.run(step, args=next(iterator)), axis=None)

    iterator = iter(strategy.experimental_distribute_dataset(data))
    fitted.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # builds the model

    def run_fit():
        fitted.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)

    def run_loop(function):
        def run():
            for _ in range(steps):
                result = function(iterator)
            if result is not None:
                float(result)
            float(looped.trainable_variables[0][0, 0])

        return run

    runs = {
        "fit": run_fit,
        "loop_and_loss": run_loop(loop_and_loss),
        "gradients_only": run_loop(gradients_only),
    }
    if flavour.uses_legacy_keras():
        return runs
    return dict(runs, **_keras3_variants(tf, strategy, fitted, data, steps))


def _keras3_variants(tf, strategy, fitted, data, steps: int) -> dict:
    import tfdist

    fitted.make_train_function()  # compile's: one step per call
    function_iterator = iter(strategy.experimental_distribute_dataset(data))

    def run_tfdist_fit():
        tfdist.fit(lambda: fitted, data, strategy=strategy, steps_per_epoch=steps, verbose=0)

    def run_train_function():
        for _ in range(steps):
            logs = fitted.train_function(function_iterator)
        float(logs["loss"])

    return {"tfdist_fit": run_tfdist_fit, "train_function": run_train_function}


def _rows(strategy_name: str, width: int, keras_flavour: str, measured: dict) -> list:
    where = "2 workers" if strategy_name == "multi_worker_mirrored" else "2 vCPU"
    label = "tf_keras" if keras_flavour == "tf_keras" else "Keras 3"
    scenario = f"{strategy_name} {where}, {label}, MLP width {width}"
    rates, reference = measured["rates"], measured["rates"]["gradients_only"]
    rows = []
    for name in ("fit", "tfdist_fit", "train_function", "loop_and_loss"):
        if name in rates:
            rows.append(
                common.row(
                    f"{scenario}: {name.replace('tfdist_', 'tfdist.').replace('_', ' ')}",
                    rates[name],
                    reference,
                    "gradients-only loop",
                    "steps/s",
                    target=TARGET if "fit" in name else None,
                )
            )
    rows.append(
        common.row(
            f"{scenario}: fit, CPU",
            measured["cpu"]["fit"],
            measured["cpu"]["gradients_only"],
            "gradients-only loop",
            "CPU ms/step",
            higher_is_better=False,
            notes="this process's CPU time per step, which waits on a busy host distort less",
        )
    )
    return rows


def run(quick: bool = False) -> list:
    cfg = QUICK if quick else DEFAULT
    rows = []
    for strategy_name, workers in (("multi_worker_mirrored", 2), ("mirrored", 1)):
        for keras_flavour in FLAVOURS:
            env = {"TF_USE_LEGACY_KERAS": "1" if keras_flavour == "tf_keras" else "0"}
            for width in cfg["widths"]:
                name = f"{strategy_name}, {keras_flavour}, width {width}"
                try:
                    results = common.run_fresh(
                        measure,
                        workers=workers,
                        args=(strategy_name, width, cfg),
                        env=env,
                        timeout=cfg["timeout"],
                    )
                except Exception as err:  # one failed job is a FAILED row; the others run
                    rows.append(common.error_row(name, str(err)))
                    continue
                measured = results[0]  # worker 0; every step is synchronous between workers
                rows += _rows(strategy_name, width, keras_flavour, measured)
                medians = {n: round(statistics.median(v), 1) for n, v in measured["rates"].items()}
                print(f"{name}: {medians}", flush=True)
    return rows


if __name__ == "__main__":
    common.print_table(run(quick="--quick" in sys.argv))
