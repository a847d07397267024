"""Keras 3's `keras.distribution.DataParallel` carried by tfdist, against the same model's
`model.fit` under `tfdist.make_strategy(...)` with `strategy.scope()`.

Target: DataParallel >= 0.95x make_strategy, in examples/s, in both settings:

- "mirrored 2 vCPU": one process, `tfdist.virtual_cpus(2)`. DataParallel over
  ["cpu:0", "cpu:1"] (tfdist makes a MirroredStrategy over those devices) against
  `tfdist.make_strategy("mirrored")`.
- "multi-worker 2 proc": 2 processes on loopback, one CPU replica each.
  `keras.distribution.initialize()` builds the job's MultiWorkerMirroredStrategy with
  `tfdist.make_strategy("multi_worker_mirrored")`, and DataParallel over the job's devices
  runs on it; the baseline is the strategy that `tfdist.make_strategy("multi_worker_mirrored")`
  returns in the same process (TensorFlow allows one per process: the same object, checked,
  `same_strategy` in the JSON).

Like for like: the same model (MLP 256 -> 1024 -> 1024 -> 10 softmax, 1.3M parameters, the
same initial weights from one seed), Adam(1e-3), sparse categorical cross-entropy, global batch
128, the same cached tf.data pipeline, `steps_per_execution=1` (Keras' default, so per-step
overhead shows), verbose=0, and the timer callback `async_safe`, so that Keras keeps dispatching
batch callbacks asynchronously as it does without callbacks. Each fit starts a new pass over the
same data, so both variants must report the same per-epoch losses (`losses_match` in the JSON).

Both models live in one process (or one 2-process job): the DataParallel one is built in the
distribution's `scope()`, the baseline with no distribution set, in `strategy.scope()`. They take
turns, one fit of one epoch each, the distribution set for DataParallel's turn and unset for the
baseline's, the order alternating every round, after one untimed warm-up epoch each (tracing).
An epoch is timed from the end of its first step to the end of the epoch (the first step pays
for the new iterator); for 2 processes a round's rate is the slower process's. Rows: median
over rounds, min-max, and the min-max of the per-round ratios (DataParallel / make_strategy).
Under mirrored, each fit takes a few seconds more to return (Keras 3 on 2 local devices waits
in the tf.data iterator's teardown, with or without tfdist): untimed, but it spaces the turns.
The "(CPU)" rows give examples per CPU-second of the training process(es) (summed over the
processes), which other programs on the machine distort far less than wall time; no target.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_keras import _barrier, _Clock, _compiled, _dataset, _losses_match  # noqa: E402

VARIANTS = ("data_parallel", "make_strategy")
SCENARIOS = {
    "mirrored": "keras.distribution DataParallel, mirrored 2 vCPU",
    "multi_worker_mirrored": "keras.distribution DataParallel, multi-worker 2 proc",
}
ALTERNATIVES = {
    "mirrored": "make_strategy('mirrored') fit",
    "multi_worker_mirrored": "make_strategy('multi_worker_mirrored') fit",
}
TARGET = 0.95

DEFAULT = dict(
    features=256,
    hidden=1024,
    classes=10,
    global_batch=128,
    batches=40,
    steps_per_execution=1,
    learning_rate=1e-3,
    seed=0,
    rounds=10,  # even: each variant goes first in half of the rounds
    # about 3-5 s per epoch on 2 cores: mirrored ~60 steps/s, multi-worker ~18 steps/s
    steps={"mirrored": 200, "multi_worker_mirrored": 80},
    timeout=600,
)
QUICK = dict(DEFAULT, rounds=4, steps={"mirrored": 60, "multi_worker_mirrored": 30}, timeout=300)


def _measure(scenario, cfg):
    """Runs in each fresh process: both variants taking turns. Returns per-round measurements."""
    import tfdist  # before Keras: installs tfdist's keras.distribution

    if scenario == "mirrored":
        os.environ.pop("TF_CONFIG", None)  # one process, not a cluster
        tfdist.virtual_cpus(2)
    import keras

    if scenario == "mirrored":
        distribution = keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"])
    else:
        keras.distribution.initialize()  # the job's MultiWorkerMirroredStrategy
        distribution = keras.distribution.DataParallel()  # every device of the job
    import tensorflow as tf

    # built and compiled in distribution.scope(): set_distribution(distribution) for the block
    models = {"data_parallel": _compiled(keras, distribution, cfg)}
    strategy = tfdist.make_strategy(scenario)
    models["make_strategy"] = _compiled(keras, strategy, cfg)
    data = _dataset(tf, cfg)
    steps = cfg["steps"][scenario]
    clock = _Clock()

    class Timer(keras.callbacks.Callback):
        async_safe = True  # keeps Keras' asynchronous batch callbacks, as without a callback

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                clock.start()

        def on_epoch_end(self, epoch, logs=None):  # Keras has waited for the last step
            self.wall, self.cpu = clock.stop()
            self.loss = float(logs["loss"])

    def epoch(variant, steps):
        keras.distribution.set_distribution(distribution if variant == "data_parallel" else None)
        timer = Timer()
        models[variant].fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
        keras.distribution.set_distribution(None)
        return timer

    for variant in VARIANTS:  # warm-up: tracing
        epoch(variant, 3)
    out = {v: {"wall_seconds": [], "cpu_seconds": [], "loss": []} for v in VARIANTS}
    for number in range(cfg["rounds"]):
        order = VARIANTS if number % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            timer = epoch(variant, steps)
            out[variant]["wall_seconds"].append(timer.wall)
            out[variant]["cpu_seconds"].append(timer.cpu)
            out[variant]["loss"].append(timer.loss)
    out["strategies"] = {
        v: {
            "type": type(models[v].distribute_strategy).__name__,
            "replicas": models[v].distribute_strategy.num_replicas_in_sync,
            "devices": list(models[v].distribute_strategy.extended.worker_devices),
            "cross_device_ops": type(
                getattr(models[v].distribute_strategy.extended, "_cross_device_ops", None)
            ).__name__,
        }
        for v in VARIANTS
    }
    out["same_strategy"] = models["data_parallel"].distribute_strategy is strategy
    out["load_average"] = round(os.getloadavg()[0], 2)
    if scenario == "multi_worker_mirrored":
        _barrier(tf, strategy)
    return out


def _scenario(scenario, cfg):
    workers = 2 if scenario == "multi_worker_mirrored" else 1
    started = time.perf_counter()
    results = common.run_fresh(
        _measure,
        workers=workers,
        args=(scenario, cfg),
        env={"TF_USE_LEGACY_KERAS": "0"},
        timeout=cfg["timeout"],
    )
    seconds = time.perf_counter() - started
    examples = (cfg["steps"][scenario] - 1) * cfg["global_batch"]  # timed steps of an epoch
    # a round of a job lasts as long as its slower process; CPU: summed over the processes
    samples = {
        v: [examples / max(r) for r in zip(*(p[v]["wall_seconds"] for p in results))]
        for v in VARIANTS
    }
    per_cpu = {
        v: [examples / sum(r) for r in zip(*(p[v]["cpu_seconds"] for p in results))]
        for v in VARIANTS
    }
    first = results[0]
    losses = {v: first[v]["loss"] for v in VARIANTS}
    notes = []
    if not _losses_match(losses["data_parallel"], losses["make_strategy"]):
        notes.append(f"per-epoch losses differ: {losses}")
    if workers > 1 and not all(p["same_strategy"] for p in results):
        notes.append("DataParallel did not run on make_strategy's MultiWorkerMirroredStrategy")
    if first["strategies"]["data_parallel"] != first["strategies"]["make_strategy"]:
        notes.append(f"the strategies differ: {first['strategies']}")
    print(
        f"  keras_distribution {scenario}: {seconds:.0f} s; examples/s median "
        + ", ".join(f"{v} {common.median(samples[v]):.0f}" for v in VARIANTS),
        flush=True,
    )
    detail = dict(
        config=dict(cfg, steps=cfg["steps"][scenario], workers=workers),
        rounds=len(samples["data_parallel"]),
        seconds=round(seconds, 1),
    )
    return [
        common.row(
            SCENARIOS[scenario],
            samples["data_parallel"],
            samples["make_strategy"],
            ALTERNATIVES[scenario],
            "examples/s",
            target=TARGET,
            notes="; ".join(notes),
            losses=losses,
            losses_match=_losses_match(losses["data_parallel"], losses["make_strategy"]),
            processes=results,
            **detail,
        ),
        common.row(
            SCENARIOS[scenario] + " (CPU)",
            per_cpu["data_parallel"],
            per_cpu["make_strategy"],
            ALTERNATIVES[scenario],
            "examples/CPU-s",
            **detail,
        ),
    ]


def run(quick: bool = False, **overrides) -> list:
    cfg = dict(QUICK if quick else DEFAULT, **overrides)
    rows = []
    for scenario in SCENARIOS:
        try:
            rows += _scenario(scenario, cfg)
        except Exception as err:  # noqa: BLE001 - reported as a failed row
            lines = str(err).strip().splitlines() or [""]
            sys.stderr.write("\n".join(lines[-30:]) + "\n")
            rows.append(
                common.error_row(
                    SCENARIOS[scenario],
                    f"{type(err).__name__}: {lines[0][:300]}",
                    ALTERNATIVES[scenario],
                )
            )
    return rows


if __name__ == "__main__":
    common.print_table(run(quick="--quick" in sys.argv))
