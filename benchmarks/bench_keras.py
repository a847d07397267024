"""Keras training throughput under mirrored and multi_worker_mirrored.

The same model, data and global batch, in examples/s, for three implementations:

- tfdist: Keras 3 `model.fit` on a strategy from `tfdist.make_strategy` (tfdist's fixes on).
- custom loop: a hand-written Keras 3 loop: `tf.GradientTape` + `optimizer.apply_gradients`
  inside `strategy.run`, `steps_per_execution` steps per `tf.function` call
  (`for _ in tf.range(K): strategy.run(step, args=next(iterator))`), the loss tracked in a
  `keras.metrics.Mean` updated on each replica and read once per epoch (the multi-step loop of
  the tf.distribute / TPU guides). It is the fastest loop we found: the tutorial variant that
  all-reduces the loss every step (`total += strategy.reduce(...)`) costs up to ~20% under
  multi_worker_mirrored, which would flatter tfdist (see --diagnose).
- tf_keras: `model.fit` with TF_USE_LEGACY_KERAS=1.

The two alternatives are what a user writes without tfdist: their strategy is built directly
with `tf.distribute.*` (tfdist's Keras fixes are then never applied; tf_keras does not need
them and a custom loop does not hit them), with the communication that tfdist also picks on
CPUs: `MirroredStrategy(cross_device_ops=ReductionToOneDevice())`, and
`MultiWorkerMirroredStrategy` with RING.

Like for like: same model and initial weights (same seed), Adam(1e-3), sparse categorical
cross-entropy, global batch 256, the same tf.data pipeline (cached batches, repeated), and both
`fit`s compiled with `steps_per_execution=K`, the custom loop's steps per call (K=10). All
implementations report the same per-epoch losses (checked: `losses_match` in the JSON).

Strategies: mirrored on 2 virtual CPUs in one process; multi_worker_mirrored with 2 processes on
loopback, one CPU replica each. Each implementation runs in its own fresh process(es) (the Keras
flavour and the CPU split are fixed per process). This machine is shared and noisy, so the
implementations of a strategy are started together and then take turns: after all of them have
built their model and run one untimed warm-up epoch (tracing), the driver lets one at a time run
one timed epoch while the others wait idle (blocked, using no CPU), rotating the order every
round. Each round therefore measures all of them side by side, within seconds of each other, and
the per-round ratios are paired. A session is one such set of fresh processes with
`timed_epochs` rounds; `sessions` sessions per strategy. Rows: median over all timed epochs,
min-max over them, and the min-max of the per-round ratios. For 2 workers an epoch lasts until
the slower worker ends it. Extra "CPU" rows give examples per CPU-second of the training
processes (summed over workers), which other programs on the machine distort far less than
wall time; targets are judged on the wall-time (examples/s) rows only.

Diagnostics (not run by run.py): `python benchmarks/bench_keras.py --diagnose mirrored` (or
multi_worker_mirrored) runs variants of the training step interleaved in one process (or one
2-worker job), all on tfdist's strategy, to tell where fit's time goes: the fit loop and
callbacks, Keras' train function alone, Keras' train_step in a hand-written loop, and the custom
loop with and without a per-step loss all-reduce, at steps_per_execution 1 and K.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

IMPLEMENTATIONS = ("tfdist", "custom_loop", "tf_keras")
ENV = {
    "tfdist": {"TF_USE_LEGACY_KERAS": "0"},
    "custom_loop": {"TF_USE_LEGACY_KERAS": "0"},
    "tf_keras": {"TF_USE_LEGACY_KERAS": "1"},
}
STRATEGIES = ("mirrored", "multi_worker_mirrored")
LABELS = {"mirrored": "keras mirrored 2 vCPU", "multi_worker_mirrored": "keras multi-worker 2 proc"}
ALTERNATIVES = {"custom_loop": "custom loop", "tf_keras": "tf_keras fit"}
# Targets for tfdist / alternative (examples/s).
TARGETS = {
    ("mirrored", "custom_loop"): 0.95,
    ("multi_worker_mirrored", "custom_loop"): 0.95,
    ("mirrored", "tf_keras"): 1.0,
    ("multi_worker_mirrored", "tf_keras"): 1.1,
}

DEFAULT = dict(
    features=64,
    hidden=512,
    classes=10,
    global_batch=256,
    batches=40,
    steps_per_epoch=40,
    steps_per_execution=10,
    timed_epochs=5,
    sessions=2,
    learning_rate=1e-3,
    seed=0,
    process_timeout=420,
    turn_timeout=180,
    budget_seconds=390,
)
QUICK = dict(DEFAULT, steps_per_epoch=20, timed_epochs=3, sessions=1)


# ------------------------------------------------------------------- the child process


def _setup(strategy_name, impl):
    """Builds the strategy first thing (before TensorFlow initialises): (tf, keras, strategy).

    tfdist (and its diagnostic variant) get `tfdist.make_strategy`; the alternatives a strategy
    built directly with tf.distribute, with the communication tfdist picks on CPUs.
    """
    import tfdist

    if strategy_name == "mirrored":
        os.environ.pop("TF_CONFIG", None)  # one process, not a cluster
        devices = tfdist.virtual_cpus(2)
    import tensorflow as tf

    if impl == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    if impl.startswith("tfdist"):
        if strategy_name == "mirrored":
            strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
        else:
            strategy = tfdist.make_strategy("multi_worker_mirrored")
    elif strategy_name == "mirrored":
        strategy = tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    else:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return tf, keras, strategy


def _dataset(tf, cfg):
    """Synthetic, learnable classification data from a fixed seed: cached batches, repeated."""
    import numpy as np

    rng = np.random.RandomState(cfg["seed"])
    x = rng.randn(cfg["batches"] * cfg["global_batch"], cfg["features"]).astype("float32")
    w = rng.randn(cfg["features"], cfg["classes"]).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int32")
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(cfg["global_batch"], drop_remainder=True)
        .cache()
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )


def _model(keras, cfg):
    keras.utils.set_random_seed(cfg["seed"])
    return keras.Sequential(
        [
            keras.Input((cfg["features"],)),
            keras.layers.Dense(cfg["hidden"], activation="relu"),
            keras.layers.Dense(cfg["hidden"], activation="relu"),
            keras.layers.Dense(cfg["classes"], activation="softmax"),
        ]
    )


def _compiled(keras, strategy, cfg, steps_per_execution=None):
    with strategy.scope():
        model = _model(keras, cfg)
        model.compile(
            optimizer=keras.optimizers.Adam(cfg["learning_rate"]),
            loss="sparse_categorical_crossentropy",
            steps_per_execution=steps_per_execution or cfg["steps_per_execution"],
        )
    return model


class _Clock:
    """Wall and CPU seconds of a stretch of work."""

    def start(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self):
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class _Turns:
    """The child's side of turn-taking: files in a directory the driver shares with it.

    Epoch 0 (warm-up) starts at once; epoch e >= 1 waits for the driver's `go-<impl>-<e>`.
    After each epoch the child writes `done-<impl>-<e>-<task index>`. Without a directory
    (standalone use) nothing waits.
    """

    def __init__(self, directory, impl, timeout):
        self.directory, self.impl, self.timeout = directory, impl, timeout
        self.task = os.environ.get("TFDIST_TASK", "worker:0").split(":")[-1]
        self.parent = os.getppid()

    def wait(self, epoch):
        if not self.directory or epoch == 0:
            return
        path = os.path.join(self.directory, f"go-{self.impl}-{epoch}")
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline or os.getppid() != self.parent:
                raise TimeoutError(f"no turn for {self.impl} epoch {epoch}: the driver is gone")
            time.sleep(0.005)

    def done(self, epoch):
        if self.directory:
            path = os.path.join(self.directory, f"done-{self.impl}-{epoch}-{self.task}")
            with open(path, "w"):
                pass


def _fit(tf, keras, strategy, data, cfg, turns):
    """One fit() of 1 + timed_epochs epochs; an epoch callback takes turns and times epochs."""
    model = _compiled(keras, strategy, cfg)
    epochs, losses, clock = [], [], _Clock()

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            turns.wait(epoch)
            clock.start()

        def on_epoch_end(self, epoch, logs=None):
            epochs.append(clock.stop())  # Keras has synced the epoch's last step by now
            losses.append(float(logs["loss"]))
            turns.done(epoch)

    model.fit(
        data,
        epochs=1 + cfg["timed_epochs"],
        steps_per_epoch=cfg["steps_per_epoch"],
        verbose=0,
        callbacks=[EpochTimer()],
    )
    return epochs[1:], losses


def _custom_loop_parts(tf, keras, strategy, cfg, per_step_reduce=False, steps=None):
    """The hand-written loop: returns (train(iterator) -> None or loss, loss metric)."""
    batch = cfg["global_batch"]
    steps = steps or cfg["steps_per_execution"]
    with strategy.scope():
        model = _model(keras, cfg)
        optimizer = keras.optimizers.Adam(cfg["learning_rate"])
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        mean_loss = keras.metrics.Mean()

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        mean_loss.update_state(per_example)
        return loss

    if per_step_reduce:  # the tutorial's variant: a cross-replica loss every step

        @tf.function
        def train(iterator):
            total = tf.constant(0.0)
            for _ in tf.range(steps):
                per_replica = strategy.run(step, args=next(iterator))
                total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            return total / steps
    else:

        @tf.function
        def train(iterator):
            for _ in tf.range(steps):
                strategy.run(step, args=next(iterator))

    return train, mean_loss


def _custom_loop(tf, keras, strategy, data, cfg, turns):
    train, mean_loss = _custom_loop_parts(tf, keras, strategy, cfg)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    calls = cfg["steps_per_epoch"] // cfg["steps_per_execution"]
    epochs, losses, clock = [], [], _Clock()
    for epoch in range(1 + cfg["timed_epochs"]):  # epoch 0: warm-up (tracing)
        mean_loss.reset_state()
        turns.wait(epoch)
        clock.start()
        for _ in range(calls):
            train(iterator)
        loss = float(mean_loss.result())  # waits for the epoch's last step
        epochs.append(clock.stop())
        losses.append(loss)
        turns.done(epoch)
    return epochs[1:], losses


def _barrier(tf, strategy):
    """All workers reach this point before any exits (a peer's exit breaks collectives)."""
    value = strategy.run(lambda: tf.constant(1.0))
    strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)


def _threads():
    """This process's OS thread count (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration):
        return None


def measure(impl, strategy_name, cfg, turn_dir=None):
    """Runs in a fresh process. Returns each timed epoch's wall and CPU seconds, and more."""
    begin = time.perf_counter()
    turns = _Turns(turn_dir, impl, cfg["turn_timeout"])
    tf, keras, strategy = _setup(strategy_name, impl)
    data = _dataset(tf, cfg)
    ready = time.perf_counter()
    train = _custom_loop if impl == "custom_loop" else _fit
    epochs, losses = train(tf, keras, strategy, data, cfg, turns)
    threads = _threads()
    if strategy_name == "multi_worker_mirrored":
        _barrier(tf, strategy)
    return {
        "threads_after_training": threads,
        "epoch_seconds": [wall for wall, _ in epochs],
        "cpu_seconds": [cpu for _, cpu in epochs],
        "losses": losses,
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "keras": keras.__version__,
        "load_average": round(os.getloadavg()[0], 2),
        "setup_seconds": round(ready - begin, 2),
    }


# -------------------------------------------------------------------------- the driver


def _workers(strategy_name):
    return 2 if strategy_name == "multi_worker_mirrored" else 1


def _implementations(strategy_name):
    return IMPLEMENTATIONS


def _launch(impl, strategy_name, cfg, turn_dir):
    return common.run_fresh(
        measure,
        workers=_workers(strategy_name),
        args=(impl, strategy_name, cfg, turn_dir),
        env=ENV[impl],
        timeout=cfg["process_timeout"],
    )


def _await(paths, future, timeout):
    """Waits until every path exists; False if the job ended first or time ran out."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if future.done() or time.monotonic() > deadline:
            return all(os.path.exists(p) for p in paths)
        time.sleep(0.005)
    return True


def _session(strategy_name, cfg, number):
    """One set of fresh processes, the implementations taking turns epoch by epoch.

    Returns ({impl: [examples/s per timed epoch]}, {impl: [examples/CPU-s]}, {impl: round
    indices}, {impl: process values}, {impl: error}).
    """
    import concurrent.futures
    import tempfile

    workers = _workers(strategy_name)
    impls = _implementations(strategy_name)
    examples = cfg["steps_per_epoch"] * cfg["global_batch"]
    failed = {}
    ran = {impl: [] for impl in impls}  # the epochs each one completed
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="tfdist-bench-") as turn_dir,
        concurrent.futures.ThreadPoolExecutor(len(impls)) as pool,
    ):
        futures = {impl: pool.submit(_launch, impl, strategy_name, cfg, turn_dir) for impl in impls}

        def done(impl, epoch):
            return [os.path.join(turn_dir, f"done-{impl}-{epoch}-{t}") for t in range(workers)]

        for impl in impls:  # set-up and warm-up, all at once (untimed)
            if not _await(done(impl, 0), futures[impl], cfg["process_timeout"]):
                failed[impl] = "no warm-up epoch"
        ready = time.perf_counter()
        for epoch in range(1, cfg["timed_epochs"] + 1):
            shift = (epoch - 1 + number) % len(impls)
            for impl in impls[shift:] + impls[:shift]:
                if impl in failed:
                    continue
                with open(os.path.join(turn_dir, f"go-{impl}-{epoch}"), "w"):
                    pass
                if _await(done(impl, epoch), futures[impl], cfg["turn_timeout"]):
                    ran[impl].append(epoch)
                else:
                    failed[impl] = f"epoch {epoch} did not end"
        values, rates, per_cpu = {}, {}, {}
        for impl, future in futures.items():
            try:
                values[impl] = future.result()
            except Exception as err:  # noqa: BLE001 - reported as a failed row
                lines = str(err).strip().splitlines() or [""]
                failed[impl] = f"{type(err).__name__}: {lines[0][:200]}"
                sys.stderr.write("\n".join(lines[-20:]) + "\n")
                continue
            walls = [max(e) for e in zip(*(v["epoch_seconds"] for v in values[impl]))]
            cpus = [sum(e) for e in zip(*(v["cpu_seconds"] for v in values[impl]))]
            rates[impl] = [examples / w for w in walls]
            per_cpu[impl] = [examples / c for c in cpus]
    print(
        f"  keras session {number + 1} {strategy_name}: {time.perf_counter() - started:.0f} s "
        f"(set-up and warm-up {ready - started:.0f} s); examples/s median "
        + ", ".join(f"{i} {common.median(r):.0f}" for i, r in rates.items())
        + "".join(f"; {i} FAILED: {e}" for i, e in failed.items()),
        flush=True,
    )
    rounds = {impl: [(number, e) for e in ran[impl]] for impl in rates}
    return rates, per_cpu, rounds, values, failed


def _losses_match(a, b, tolerance=1e-3):
    return len(a) == len(b) and all(
        abs(x - y) <= tolerance * max(1.0, abs(x)) for x, y in zip(a, b)
    )


def _paired(ours, our_rounds, theirs, their_rounds):
    """The samples of both sides restricted to the rounds both completed, in the same order."""
    common_rounds = [r for r in our_rounds if r in set(their_rounds)]
    a = dict(zip(our_rounds, ours))
    b = dict(zip(their_rounds, theirs))
    return [a[r] for r in common_rounds], [b[r] for r in common_rounds]


def run(quick: bool = False, **overrides) -> list:
    """Measures every implementation under both strategies; returns the benchmark's rows.

    Starts no new session once the next one would likely end after `budget_seconds`.
    """
    cfg = dict(QUICK if quick else DEFAULT, **overrides)
    keys = [(s, i) for s in STRATEGIES for i in _implementations(s)]
    wall = {k: [] for k in keys}
    cpu = {k: [] for k in keys}
    rounds = {k: [] for k in keys}
    processes = {k: [] for k in keys}
    failures = {}
    started = time.perf_counter()
    spent = {s: [] for s in STRATEGIES}
    for number in range(cfg["sessions"]):
        for strategy_name in STRATEGIES:
            elapsed = time.perf_counter() - started
            if spent[strategy_name] and elapsed + max(spent[strategy_name]) > cfg["budget_seconds"]:
                print(
                    f"  keras: no session {number + 1} of {strategy_name} ({elapsed:.0f} s "
                    f"spent; budget {cfg['budget_seconds']} s)",
                    flush=True,
                )
                continue
            begin = time.perf_counter()
            rates, per_cpu, done, values, failed = _session(strategy_name, cfg, number)
            spent[strategy_name].append(time.perf_counter() - begin)
            for impl in rates:
                wall[strategy_name, impl] += rates[impl]
                cpu[strategy_name, impl] += per_cpu[impl]
                rounds[strategy_name, impl] += done[impl]
                processes[strategy_name, impl].append(values[impl])
            for impl, error in failed.items():
                failures[strategy_name, impl] = error
    rows = []
    comparisons = [(s, "tfdist", alt) for s in STRATEGIES for alt in ("custom_loop", "tf_keras")]
    for metric, samples, unit, suffix in (
        ("wall", wall, "examples/s", ""),
        ("cpu", cpu, "examples/CPU-s", " (CPU)"),
    ):
        for strategy_name, ours_name, alt in comparisons:
            scenario = LABELS[strategy_name] + suffix
            ours, theirs = _paired(
                samples[strategy_name, ours_name],
                rounds[strategy_name, ours_name],
                samples[strategy_name, alt],
                rounds[strategy_name, alt],
            )
            if not ours:
                error = failures.get((strategy_name, ours_name)) or failures.get(
                    (strategy_name, alt), "no measurement"
                )
                rows.append(common.error_row(scenario, error, ALTERNATIVES[alt]))
                continue
            detail = {"config": cfg, "samples_per_side": len(ours), "implementation": ours_name}
            notes = ""
            if metric == "wall":
                mine = processes[strategy_name, ours_name][0][0]["losses"]
                other = processes[strategy_name, alt][0][0]["losses"]
                detail.update(
                    losses={"tfdist": mine, "alternative": other},
                    losses_match=_losses_match(mine, other),
                    processes={
                        "tfdist": processes[strategy_name, ours_name],
                        "alternative": processes[strategy_name, alt],
                    },
                )
                if not detail["losses_match"]:
                    notes = f"per-epoch losses differ: {mine} vs {other}"
                threads = [
                    max(
                        w["threads_after_training"] or 0 for w in processes[strategy_name, name][-1]
                    )
                    for name in (ours_name, alt)
                ]
                if strategy_name == "multi_worker_mirrored" and alt == "tf_keras":
                    notes = (notes + "; " if notes else "") + (
                        f"OS threads per process after training: {threads[0]} vs {threads[1]}"
                    )
                failed = [
                    f"{i}: {failures[strategy_name, i]}"
                    for i in (ours_name, alt)
                    if (strategy_name, i) in failures
                ]
                if failed:
                    notes = (notes + "; " if notes else "") + "failures: " + "; ".join(failed)
            target = (
                TARGETS[strategy_name, alt] if metric == "wall" and ours_name == "tfdist" else None
            )
            rows.append(
                common.row(
                    scenario,
                    ours,
                    theirs,
                    ALTERNATIVES[alt],
                    unit,
                    target=target,
                    notes=notes,
                    **detail,
                )
            )
    return rows


# ---------------------------------------------------------------------------- diagnose


def diagnose(strategy_name, rounds=5, steps=40):
    """Variants of one training step, interleaved epoch by epoch in one process (or job).

    fit_K: the epochs of one long fit(steps_per_execution=K), timed by a callback; the other
    variants run one epoch each between fit's epochs (in on_epoch_end), so all share the same
    moments of a noisy machine. Returns {variant: {"examples_per_s": [...], "cpu_ms_per_step":
    median}}.
    """
    tf, keras, strategy = _setup(strategy_name, "tfdist")
    diagnosis = _Diagnosis(tf, keras, strategy, steps)
    k = diagnosis.cfg["steps_per_execution"]
    diagnosis.add_variants(
        {
            f"keras_train_function_{k}": diagnosis.keras_train_function(k),
            "keras_train_function_1": diagnosis.keras_train_function(1),
            f"keras_train_step_in_custom_loop_{k}": diagnosis.keras_train_step_in_loop(k),
            f"custom_loop_{k}": diagnosis.custom(k),
            "custom_loop_1": diagnosis.custom(1),
            f"custom_loop_{k}_loss_allreduce_every_step": diagnosis.custom(k, per_step_reduce=True),
        },
        fits=[f"fit_{k}", "fit_1"],
    )
    diagnosis.fit_timed(k, f"fit_{k}", list(diagnosis.variants), rounds)
    diagnosis.fit_timed(1, "fit_1", ["keras_train_function_1", "custom_loop_1"], rounds)
    return diagnosis.medians()


class _Diagnosis:
    """The variants `diagnose` times, on one strategy: each is an epoch (a function that runs
    `steps` steps), timed between the epochs of a long fit (`fit_timed`)."""

    def __init__(self, tf, keras, strategy, steps):
        self.tf, self.keras, self.strategy, self.steps = tf, keras, strategy, steps
        self.cfg = dict(DEFAULT)
        self.data = _dataset(tf, self.cfg)
        self.variants = {}  # name -> epoch function
        self.times = {}  # name -> [(wall, cpu) seconds of each timed epoch]
        self.clock = _Clock()

    def add_variants(self, variants, fits):
        """Runs each variant's warm-up epoch; times will hold the `fits` and the variants."""
        self.variants = variants
        for epoch in variants.values():
            epoch()  # warm-up
        self.times = {name: [] for name in [*fits, *variants]}

    def _iterator(self):
        return iter(self.strategy.experimental_distribute_dataset(self.data))

    def keras_train_function(self, spe):
        """Keras' compiled train function, no fit loop or callbacks."""
        model = _compiled(self.keras, self.strategy, self.cfg, steps_per_execution=spe)
        model.fit(self.data, epochs=1, steps_per_epoch=spe, verbose=0)  # build and trace
        iterator = self._iterator()

        def epoch():
            for _ in range(self.steps // spe):
                logs = model.train_function(iterator)
            float(logs["loss"])

        return epoch

    def keras_train_step_in_loop(self, spe):
        """Keras' train_step in a hand-written multi-step loop."""
        tf, strategy = self.tf, self.strategy
        model = _compiled(self.keras, strategy, self.cfg, steps_per_execution=1)
        model.fit(self.data, epochs=1, steps_per_epoch=1, verbose=0)

        @tf.function
        def train(iterator):
            for _ in tf.range(spe):
                strategy.run(model.train_step, args=(next(iterator),))

        iterator = self._iterator()

        def epoch():
            for _ in range(self.steps // spe):
                train(iterator)
            float(model.optimizer.iterations.numpy())

        return epoch

    def custom(self, spe, per_step_reduce=False):
        """The custom loop (the benchmark's alternative)."""
        train, mean_loss = _custom_loop_parts(
            self.tf, self.keras, self.strategy, self.cfg, per_step_reduce, spe
        )
        iterator = self._iterator()

        def epoch():
            for _ in range(self.steps // spe):
                train(iterator)
            float(mean_loss.result())

        return epoch

    def fit_timed(self, spe, name, others, rounds):
        """Times `rounds` epochs of one fit as `name`, each followed by an epoch of `others`."""
        model = _compiled(self.keras, self.strategy, self.cfg, steps_per_execution=spe)
        clock, times, variants = self.clock, self.times, self.variants

        class Interleave(self.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                clock.start()

            def on_epoch_end(self, epoch, logs=None):
                elapsed = clock.stop()
                if epoch == 0:
                    return  # tracing
                times[name].append(elapsed)
                for other in others:
                    clock.start()
                    variants[other]()
                    times[other].append(clock.stop())

        model.fit(
            self.data,
            epochs=1 + rounds,
            steps_per_epoch=self.steps,
            verbose=0,
            callbacks=[Interleave()],
        )

    def medians(self):
        """{variant: its examples/s per epoch, their median and the median CPU ms per step}."""
        examples = self.steps * self.cfg["global_batch"]
        return {
            name: {
                "examples_per_s": [round(examples / w) for w, _ in samples],
                "median_examples_per_s": round(statistics.median(examples / w for w, _ in samples)),
                "cpu_ms_per_step": round(
                    statistics.median(c for _, c in samples) / self.steps * 1000, 1
                ),
            }
            for name, samples in self.times.items()
            if samples
        }


def _print_diagnosis(result):
    for name, r in result.items():
        print(
            f"  {name:<45} {r['median_examples_per_s']:>7} examples/s (median)  "
            f"{r['cpu_ms_per_step']:>5} CPU ms/step  epochs: {r['examples_per_s']}"
        )


if __name__ == "__main__":
    if "--diagnose" in sys.argv:
        which = sys.argv[sys.argv.index("--diagnose") + 1]
        if which == "mirrored":
            _print_diagnosis(common.run_fresh(diagnose, args=(which,), timeout=600)[0])
        else:
            for i, value in enumerate(
                common.run_fresh(diagnose, workers=2, args=(which,), timeout=600)
            ):
                print(f"worker {i}:")
                _print_diagnosis(value)
    else:
        common.print_table(run(quick="--quick" in sys.argv))
