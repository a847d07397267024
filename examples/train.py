"""Train a digit classifier with tfdist, on any strategy, in any role of any job.

The same script runs unchanged everywhere; only the environment differs:

    python examples/train.py --virtual_cpus 2             # mirrored on 2 logical CPUs
    tfdist launch --workers 2 examples/train.py           # multi_worker_mirrored, 2 processes
    tfdist launch --workers 2 --ps 1 examples/train.py    # parameter_server (chief trains)
    srun python examples/train.py                         # SLURM (examples/slurm/)
    # Kubernetes: an Indexed Job or a JobSet, TF_CONFIG per pod (examples/kubernetes/)

With --backup_dir, tfdist.BackupAndRestore backs training up there after every epoch and,
on SIGTERM to any task, stops every worker after the same step, saves, and exits with code
143 (tfdist.PREEMPTED_EXIT_CODE); the same command run again resumes at the next step.

Data: scikit-learn's handwritten digits (8x8 images, 10 classes), shipped inside the package,
so nothing is downloaded. 80% trains, 20% is held out (examples/digits.py, with the model).
The scripts next to this one show one strategy each, in the idiom that suits it:
mirrored.py, multi_worker.py, parameter_server.py, mixed_precision.py.
"""

import os

import digits
from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
digits.define_flags(epochs=8)  # --epochs, --global_batch_size, --learning_rate
flags.DEFINE_string("strategy", "auto", "tfdist strategy name (auto picks from the cluster).")
flags.DEFINE_integer("virtual_cpus", 0, "Split the CPU into this many logical devices.")
flags.DEFINE_string("precision", "float32", "Keras policy name, or auto.")
flags.DEFINE_integer(
    "embedding_shards",
    0,
    "parameter_server: shard the pixel embedding over the ps tasks when > 0 "
    "(a partitioner with this many shards at most).",
)
flags.DEFINE_string(
    "model_dir", "", "Where the chief saves the trained weights (digits.weights.h5)."
)
flags.DEFINE_string(
    "backup_dir",
    "",
    "Back training up here (on storage every task shares) and resume from it: "
    "tfdist.BackupAndRestore, which also saves on SIGTERM and exits with code 143.",
)


def build_model():
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    model = digits.embedding_model()  # its Embedding table: what --embedding_shards shards
    model.compile(
        optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main(argv):
    del argv
    if FLAGS.virtual_cpus:
        tfdist.virtual_cpus(FLAGS.virtual_cpus)
    options = {}
    if FLAGS.embedding_shards:
        options = {"variable_partitioner": "fixed", "max_shards": FLAGS.embedding_shards}
    strategy = tfdist.make_strategy(FLAGS.strategy, **options)  # worker/ps tasks serve here
    tfdist.set_precision(FLAGS.precision)
    spec = tfdist.detect_cluster()
    (x_train, y_train), (x_test, y_test) = digits.load()
    callbacks = [tfdist.BackupAndRestore(FLAGS.backup_dir)] if FLAGS.backup_dir else []
    # an epoch: one pass over the examples, on every strategy (steps_per_epoch= changes it)
    history = tfdist.fit(
        build_model,
        (x_train, y_train),
        strategy=strategy,
        epochs=FLAGS.epochs,
        global_batch_size=FLAGS.global_batch_size,
        shuffle=True,
        seed=0,
        callbacks=callbacks,
    )
    results = tfdist.evaluate(
        history.model,
        (x_test, y_test),
        strategy=strategy,
        global_batch_size=FLAGS.global_batch_size,
    )
    if spec.is_chief:
        print(
            f"{type(strategy).__name__}: held-out accuracy {results['accuracy']:.3f} "
            f"(chance 0.100), loss {results['loss']:.3f}",
            flush=True,
        )
        if FLAGS.model_dir:
            os.makedirs(FLAGS.model_dir, exist_ok=True)
            path = os.path.join(FLAGS.model_dir, "digits.weights.h5")
            history.model.save_weights(path)
            print(f"weights saved to {path}", flush=True)


if __name__ == "__main__":
    app.run(main)
