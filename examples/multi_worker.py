"""Multi-worker training with the plain Keras idiom, with checkpoints and a resumable backup.

    tfdist launch --workers 2 examples/multi_worker.py                  # 2 processes, this machine
    tfdist launch --workers 2 examples/multi_worker.py --model_dir /tmp/digits --epochs 4
    tfdist launch --workers 2 --max-restarts 1 examples/multi_worker.py # resumes after a crash

Every worker runs this script. `tfdist.make_strategy("multi_worker_mirrored")` reads the
cluster from TF_CONFIG (set per process by `tfdist launch`, or by Kubernetes) or from a SLURM
step, and returns a MultiWorkerMirroredStrategy: each step all-reduces the gradients of every
worker, so all workers end with the same weights. The model is built and compiled inside
`strategy.scope()`; `fit` and `evaluate` are Keras's own, on a tf.data dataset batched with the
global batch size, the same on every worker (same data, same shuffle seed); each worker reads
its own part of every batch.

Under `--model_dir` (a path all workers share), `ModelCheckpoint` saves the weights after
every epoch and `BackupAndRestore` keeps a backup that a restarted job resumes from; both are
written once, by the chief, and the backup is removed when training ends. Keras's progress
bar shows on the chief only (tfdist leaves it out on the other workers; TFDIST_PROGRESS=all
shows it everywhere), and the chief prints the held-out accuracy on scikit-learn's digits
(chance: 0.100).
"""

import os
import tempfile

import digits
from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
digits.define_flags(epochs=6)  # --epochs, --global_batch_size, --learning_rate
flags.DEFINE_string(
    "model_dir",
    os.path.join(tempfile.gettempdir(), "tfdist-multi-worker"),
    "Checkpoints and the backup; on several machines, a shared filesystem.",
)


def main(argv):
    del argv
    strategy = tfdist.make_strategy("multi_worker_mirrored")  # first: configures collectives
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    chief = tfdist.detect_cluster().is_chief
    if chief:
        print(
            f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas in sync, "
            f"files under {FLAGS.model_dir}",
            flush=True,
        )

    (x_train, y_train), (x_test, y_test) = digits.load()
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=0)
        .batch(FLAGS.global_batch_size)
    )
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(FLAGS.global_batch_size)

    with strategy.scope():
        model = digits.dense_model()
        model.compile(
            optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(FLAGS.model_dir, "backup")),
        keras.callbacks.ModelCheckpoint(
            os.path.join(FLAGS.model_dir, "epoch{epoch:02d}.weights.h5"), save_weights_only=True
        ),
    ]
    model.fit(
        train, epochs=FLAGS.epochs, callbacks=callbacks, shuffle=False
    )  # the dataset shuffles itself (Keras 3 warns about shuffle=True)
    loss, accuracy = model.evaluate(test, verbose=0)  # every worker takes part

    if chief:
        print(f"in {FLAGS.model_dir}: {', '.join(sorted(os.listdir(FLAGS.model_dir)))}")
        print(
            f"{type(strategy).__name__}: held-out accuracy {accuracy:.3f} (chance 0.100), "
            f"loss {loss:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
