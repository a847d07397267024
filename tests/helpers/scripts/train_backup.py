"""A 2-worker Keras job with BackupAndRestore, for the launcher's restart test.

    python train_backup.py DIRECTORY [--kill-worker-1-in-epoch N] [--step-seconds S]

Worker 1 kills itself (SIGKILL) in the middle of epoch N (1-based) the first time only. With
--step-seconds, every step takes S seconds more (time for a test to act in mid-training).
The chief appends each finished epoch to DIRECTORY/epochs.log and saves the final weights
to DIRECTORY/final.npz.
"""

import os
import signal
import sys
import time

import numpy as np

import tfdist


def main(directory, kill_in_epoch=None, step_seconds=0.0):
    strategy = tfdist.make_strategy()
    import tensorflow as tf

    from tfdist import flavour

    keras = flavour.keras()
    spec = tfdist.detect_cluster()
    rng = np.random.RandomState(0)
    x = rng.rand(96, 4).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [3.0], [0.5]], dtype="float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse")
    marker = os.path.join(directory, "killed-once")

    class Chaos(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            time.sleep(step_seconds)
            if (
                kill_in_epoch is not None
                and spec.task_index == 1
                and batch == 5
                and self.epoch == kill_in_epoch - 1
                and not os.path.exists(marker)
            ):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_end(self, epoch, logs=None):
            if spec.is_chief:
                with open(os.path.join(directory, "epochs.log"), "a") as f:
                    f.write(f"{epoch} {logs['loss']:.6f}\n")

    model.fit(
        data,
        epochs=3,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")), Chaos()],
    )
    if spec.is_chief:
        np.savez(os.path.join(directory, "final.npz"), *model.get_weights())


if __name__ == "__main__":
    flags = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    kill = flags.get("--kill-worker-1-in-epoch")
    main(
        sys.argv[1],
        int(kill) if kill else None,
        float(flags.get("--step-seconds", 0)),
    )
