"""Parameter-server training throughput: tfdist (Keras 3) vs tf_keras.

The parameter-server row of the suite.

The same model, data and batch in examples/s, 2 workers + 1 ps + the coordinator (chief), all
separate processes on loopback, at steps_per_execution k in {1, 10, 50}:

- tfdist: a Keras 3 model compiled in the scope of `tfdist.make_strategy()` (a
  ParameterServerStrategy, from TF_CONFIG), trained by
  `tfdist.parameter_server.fit_parameter_server` (what `tfdist.fit` calls on parameter_server)
  with `steps_per_execution=k`.
- tf_keras: `model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
  steps_per_execution=k)` (TF_USE_LEGACY_KERAS=1) on a `tf.distribute.ParameterServerStrategy`
  built directly from `TFConfigClusterResolver`, as a tf_keras user writes it.

Like for like: the same dataset function (synthetic, learnable data from a fixed seed, cached
batches of `batch` examples, repeated), the same MLP and initial weights, Adam, sparse
categorical cross-entropy and an accuracy metric, `verbose=0`; the workers and the ps are the
same `python -m tfdist serve` processes for both. A step is one worker's batch, so an epoch of
`steps_per_epoch` steps is `steps_per_epoch * batch` examples, whichever worker runs them.

Each implementation runs in a fresh cluster (chief, 2 workers, 1 ps): for each k, one fit of
1 + `timed_epochs` epochs (the first untimed: tracing, dataset creation), each epoch timed by a
callback from on_epoch_begin to on_epoch_end (both fits end an epoch after every scheduled
step has run and its metrics are read). A cluster's value for k is its median epoch. Rounds
repeat both implementations, alternating which goes first; rows are medians over rounds, with
the min-max over rounds and of the per-round ratios. Target: tfdist >= 1.1x tf_keras
at every k.

Where the time went: tfdist's first loop read every group's logs on the coordinator
(RemoteValue.fetch, pythonified, batch callbacks dispatched), at most 4 groups in flight per
worker, and each group read every metric from the ps after its last step: 0.88x tf_keras at
k=1, 0.98x at k=10. Without batch-level callbacks (verbose 0 or 2) tfdist now reads no group's
logs but the epoch's last (metric updates stay on the ps; the epoch logs are read there), and
schedules ahead up to 511 groups. Exact steps after a worker failure cost a progress slot
increment per step on the ps, but no extra round trip: only a retried group reads its slot.

Diagnose where tfdist's time goes (not run by run.py):

    python benchmarks/bench_ps.py --diagnose [K ...]

runs, in one cluster, tfdist's fit and bare `ClusterCoordinator.schedule` loops of the same
compiled train step, interleaved epoch by epoch.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

IMPLEMENTATIONS = ("tfdist", "tf_keras")
STEPS_PER_EXECUTION = (1, 10, 50)
TARGET = 1.1

DEFAULT = dict(
    features=32,
    hidden=128,
    classes=10,
    batch=64,
    batches=32,
    steps_per_epoch=200,
    timed_epochs=3,
    rounds=3,
    learning_rate=1e-3,
    seed=0,
    ks=STEPS_PER_EXECUTION,
    process_timeout=420,
    budget_seconds=600,
)
QUICK = dict(DEFAULT, steps_per_epoch=100, timed_epochs=2, rounds=1)


# ------------------------------------------------------------------- the chief process


def dataset_fn(input_context=None, cfg=None):
    """Synthetic classification data from a fixed seed: cached batches, repeated."""
    import numpy as np
    import tensorflow as tf

    cfg = cfg or DEFAULT
    rng = np.random.RandomState(cfg["seed"])
    x = rng.randn(cfg["batches"] * cfg["batch"], cfg["features"]).astype("float32")
    w = rng.randn(cfg["features"], cfg["classes"]).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int32")
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(cfg["batch"], drop_remainder=True)
        .cache()
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )


def _model(keras, strategy, cfg, k):
    keras.utils.set_random_seed(cfg["seed"])
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((cfg["features"],)),
                keras.layers.Dense(cfg["hidden"], activation="relu"),
                keras.layers.Dense(cfg["hidden"], activation="relu"),
                keras.layers.Dense(cfg["classes"]),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(cfg["learning_rate"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=k,
        )
    return model


def _setup(impl):
    import tensorflow as tf

    if impl == "tf_keras":
        import tf_keras as keras

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
    else:
        import keras

        import tfdist

        strategy = tfdist.make_strategy("parameter_server")
    return tf, keras, strategy


def _epoch_timer(keras, seconds, losses):
    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append((time.perf_counter() - self.wall, time.process_time() - self.cpu))
            losses.append(float(logs["loss"]))

    return EpochTimer()


def measure(impl, cfg):
    """Runs on the chief of a fresh cluster. Returns per-k epoch times and more."""
    begin = time.perf_counter()
    tf, keras, strategy = _setup(impl)
    ready = time.perf_counter()
    out = {
        "strategy": type(strategy).__name__,
        "keras": keras.__version__,
        "workers": strategy.extended._num_workers,
        "k": {},
    }
    for k in cfg["ks"]:
        model = _model(keras, strategy, cfg, k)
        seconds, losses = [], []
        callbacks = [_epoch_timer(keras, seconds, losses)]
        epochs = 1 + cfg["timed_epochs"]

        def make(input_context):
            return dataset_fn(input_context, cfg)

        if impl == "tf_keras":
            model.fit(
                keras.utils.experimental.DatasetCreator(make),
                epochs=epochs,
                steps_per_epoch=cfg["steps_per_epoch"],
                verbose=0,
                callbacks=callbacks,
            )
        else:
            from tfdist.parameter_server import fit_parameter_server

            fit_parameter_server(
                model,
                strategy,
                make,
                epochs=epochs,
                steps_per_epoch=cfg["steps_per_epoch"],
                verbose=0,
                callbacks=callbacks,
            )
        examples = cfg["steps_per_epoch"] * cfg["batch"]
        out["k"][k] = {
            "examples_per_s": [examples / wall for wall, _ in seconds[1:]],
            "epoch_seconds": [wall for wall, _ in seconds[1:]],
            "cpu_seconds": [cpu for _, cpu in seconds[1:]],
            "losses": losses,
            "iterations": int(model.optimizer.iterations.numpy()),
        }
    out.update(
        load_average=round(os.getloadavg()[0], 2),
        setup_seconds=round(ready - begin, 2),
        train_seconds=round(time.perf_counter() - ready, 2),
    )
    return out


# -------------------------------------------------------------------------- the driver


def _launch(impl, cfg):
    """Runs `measure` on the chief of a fresh 2-worker, 1-ps cluster; one retry."""
    from tfdist.testing import run_cluster

    env = {"TF_USE_LEGACY_KERAS": "1" if impl == "tf_keras" else "0"}
    error = ""
    for attempt in (1, 2):
        try:
            runs = run_cluster(
                measure, workers=2, ps=1, args=(impl, cfg), env=env, timeout=cfg["process_timeout"]
            )
            return runs["chief:0"].value
        except Exception as err:  # noqa: BLE001 - reported, then retried once
            error = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
            print(f"  ps {impl}: attempt {attempt} failed: {error}", flush=True)
            sys.stderr.write("\n".join(str(err).splitlines()[-15:]) + "\n")
    raise RuntimeError(error)


def run(quick: bool = False, **overrides) -> list:
    """Measures both implementations at every k; returns one row per k."""
    cfg = dict(QUICK if quick else DEFAULT, **overrides)
    ks = list(cfg["ks"])
    samples = {(impl, k): [] for impl in IMPLEMENTATIONS for k in ks}
    processes = {impl: [] for impl in IMPLEMENTATIONS}
    failures = {}
    started = time.perf_counter()
    rounds_done = 0
    for round_ in range(cfg["rounds"]):
        elapsed = time.perf_counter() - started
        if round_ and elapsed / round_ * (round_ + 1) > cfg["budget_seconds"]:
            print(
                f"  ps: stopping after {round_} round(s), {elapsed:.0f} s: another round "
                f"would pass the budget of {cfg['budget_seconds']} s",
                flush=True,
            )
            break
        order = IMPLEMENTATIONS if round_ % 2 == 0 else IMPLEMENTATIONS[::-1]
        values = {}
        for impl in order:
            start = time.perf_counter()
            try:
                values[impl] = _launch(impl, cfg)
            except RuntimeError as err:
                failures[impl] = str(err)
                continue
            processes[impl].append(values[impl])
            rates = {k: statistics.median(values[impl]["k"][k]["examples_per_s"]) for k in ks}
            print(
                f"  ps round {round_ + 1}/{cfg['rounds']}  {impl:<8} "
                + "  ".join(f"k={k}: {rates[k]:6.0f}" for k in ks)
                + f" examples/s  (cluster {time.perf_counter() - start:.0f} s, setup "
                f"{values[impl]['setup_seconds']:.0f} s, load "
                f"{values[impl]['load_average']:.1f})",
                flush=True,
            )
        if len(values) == len(IMPLEMENTATIONS):  # keep rounds paired
            for impl in IMPLEMENTATIONS:
                for k in ks:
                    samples[impl, k].append(
                        statistics.median(values[impl]["k"][k]["examples_per_s"])
                    )
            rounds_done += 1
    rows = []
    for k in ks:
        scenario = f"ps fit, 2 workers + 1 ps, k={k}"
        ours, theirs = samples["tfdist", k], samples["tf_keras", k]
        if not ours or not theirs:
            error = failures.get("tfdist") or failures.get("tf_keras", "no measurement")
            rows.append(common.error_row(scenario, error, "tf_keras fit"))
            continue
        iterations = {
            impl: [p["k"][k]["iterations"] for p in processes[impl]] for impl in IMPLEMENTATIONS
        }
        expected = (1 + cfg["timed_epochs"]) * cfg["steps_per_epoch"]
        notes = ""
        if any(i != expected for i in iterations["tfdist"]):
            notes = f"tfdist optimizer.iterations {iterations['tfdist']} != {expected}"
        rows.append(
            common.row(
                scenario,
                ours,
                theirs,
                "tf_keras fit",
                "examples/s",
                target=TARGET,
                notes=notes,
                config=cfg,
                rounds_done=rounds_done,
                steps_per_execution=k,
                iterations=iterations,
                losses={
                    impl: [p["k"][k]["losses"] for p in processes[impl]] for impl in IMPLEMENTATIONS
                },
                processes={
                    impl: [
                        {key: value for key, value in p.items() if key != "k"}
                        for p in processes[impl]
                    ]
                    for impl in IMPLEMENTATIONS
                },
            )
        )
    return rows


# ---------------------------------------------------------------------------- diagnose


def _bare_group(tf, strategy, model, k):
    """tf.function(iterator): k of the model's train steps, nothing else."""

    def group(iterator):
        for _ in tf.range(k):
            strategy.run(model.train_step, args=(next(iterator),))

    return tf.function(group)


def diagnose_job(ks, cfg, rounds=5):
    """On the chief: tfdist's fit vs bare schedule loops of the same train step, interleaved.

    Variants per k, one epoch each in turn:
      fit       fit_parameter_server, one epoch per call (after a warm-up call), whole call
      bare      coordinator.schedule(a plain tf.function: k x strategy.run(train_step)) for
                every group, one join: the floor of any loop around Keras 3's train_step
    Returns {variant_k: {"examples_per_s": median, "samples": [...]}}.
    """
    import tensorflow as tf

    from tfdist import parameter_server

    _, keras, strategy = _setup("tfdist")
    coordinator = parameter_server.coordinator_for(strategy)
    steps = cfg["steps_per_epoch"]
    examples = steps * cfg["batch"]

    def make(input_context):
        return dataset_fn(input_context, cfg)

    variants = {}
    for k in ks:
        model = _model(keras, strategy, cfg, k)
        parameter_server.fit_parameter_server(
            model, strategy, make, epochs=1, steps_per_epoch=steps, verbose=0
        )

        def fit(model=model):
            parameter_server.fit_parameter_server(
                model, strategy, make, epochs=1, steps_per_epoch=steps, verbose=0
            )

        bare_model = _model(keras, strategy, cfg, k)
        parameter_server.fit_parameter_server(
            bare_model, strategy, make, epochs=1, steps_per_epoch=k, verbose=0
        )
        iterator = iter(
            coordinator.create_per_worker_dataset(
                lambda: strategy.distribute_datasets_from_function(make)
            )
        )

        bare_group = _bare_group(tf, strategy, bare_model, k)

        def bare(bare_group=bare_group, iterator=iterator, k=k):
            for _ in range(steps // k):
                coordinator.schedule(bare_group, args=(iterator,))
            coordinator.join()

        variants[f"fit_{k}"] = fit
        variants[f"bare_{k}"] = bare
    for fn in variants.values():
        fn()  # warm-up
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(examples / (time.perf_counter() - start))
    return {
        name: {"examples_per_s": statistics.median(v), "samples": v} for name, v in times.items()
    }


def diagnose(ks=STEPS_PER_EXECUTION, **overrides):
    from tfdist.testing import run_cluster

    cfg = dict(DEFAULT, **overrides)
    runs = run_cluster(
        diagnose_job, workers=2, ps=1, args=(list(ks), cfg), timeout=cfg["process_timeout"]
    )
    result = runs["chief:0"].value
    for name, value in result.items():
        print(
            f"{name:<12} {value['examples_per_s']:8.0f} examples/s  "
            f"{[round(s) for s in value['samples']]}"
        )
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--diagnose":
        diagnose([int(k) for k in sys.argv[2:]] or STEPS_PER_EXECUTION)
    else:
        common.print_table(run(quick="--quick" in sys.argv))
