"""What `tfdist.BackupAndRestore` costs while no signal comes: steps/s of Keras 3 `model.fit`
under multi_worker_mirrored (2 processes on loopback), with the callback and without.

The worst case for a per-step cost: a small model, steps_per_execution=1, so that a step takes
milliseconds and anything the callback does per step (the counting wrapper around Keras'
training function, the flag read of the agreement, the watcher thread that polls TensorFlow's
coordination service once a second) shows. Two rows:

- "no saves": BackupAndRestore(save_freq=10**9), i.e. only the preemption machinery;
  target >= 0.97 (no measurable cost on this noisy machine);
- "save each epoch": the default save_freq="epoch" (one checkpoint per epoch of 200 steps),
  for information.

In each of the two processes, the three variants take turns epoch by epoch (one fit call of
one epoch each, order rotated every round), so every round measures them side by side. An
epoch's time runs from the end of its first step to the end of the epoch, the save included
(fit's start-up and the restore are not steps). Rows: median over rounds of the slower
worker's steps/s.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VARIANTS = ("none", "no_saves", "epoch_saves")


def _measure(rounds: int, steps: int):
    import time

    import numpy as np

    import tfdist

    strategy = tfdist.make_strategy()
    import tensorflow as tf

    keras = tfdist.flavour.keras()
    rng = np.random.RandomState(0)
    x = rng.rand(4096, 32).astype("float32")
    y = rng.randint(0, 10, 4096)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).cache().repeat()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
        )
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    times = {}

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if batch == 0:
                self.start = now

        def on_epoch_end(self, epoch, logs=None):  # after BackupAndRestore's save, if any
            self.end = time.perf_counter()

    def epoch(variant, directory):
        timer = Timer()
        callbacks = [timer]
        if variant == "no_saves":
            callbacks.insert(0, tfdist.BackupAndRestore(directory, save_freq=10**9))
        elif variant == "epoch_saves":
            callbacks.insert(0, tfdist.BackupAndRestore(directory))
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        return (steps - 1) / (timer.end - timer.start)

    shared = os.environ["BENCH_BACKUP_ROOT"]
    for variant in VARIANTS:  # warm-up: tracing
        epoch(variant, os.path.join(shared, "warmup-" + variant))
    for number in range(rounds):
        order = VARIANTS[number % 3 :] + VARIANTS[: number % 3]
        for variant in order:
            directory = os.path.join(shared, f"{variant}-{number}")
            times.setdefault(variant, []).append(epoch(variant, directory))
    return times


def run(quick: bool) -> list:
    rounds, steps = (3, 100) if quick else (9, 200)
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-backup-") as root:
        try:
            results = common.run_fresh(
                _measure,
                workers=2,
                args=(rounds, steps),
                env={"BENCH_BACKUP_ROOT": root, "TF_USE_LEGACY_KERAS": "0"},
                timeout=1200,
            )
        except Exception as err:  # pylint: disable=broad-except
            return [common.error_row("BackupAndRestore, no signal", repr(err)[:500])]
    # an epoch of a job lasts as long as its slower worker
    slower = {
        variant: [min(a, b) for a, b in zip(results[0][variant], results[1][variant])]
        for variant in VARIANTS
    }
    scenario = "keras fit + BackupAndRestore, multi_worker_mirrored 2 procs, no signal"
    return [
        common.row(
            scenario + ", no saves",
            slower["no_saves"],
            slower["none"],
            "fit without the callback",
            "steps/s",
            target=0.97,
            notes="the preemption machinery only: counting wrapper, flag read, watcher thread",
        ),
        common.row(
            scenario + ", save each epoch",
            slower["epoch_saves"],
            slower["none"],
            "fit without the callback",
            "steps/s",
            notes=f"one checkpoint per epoch of {steps} steps (the default save_freq='epoch')",
        ),
    ]


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    common.print_table(rows)
