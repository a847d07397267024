"""Mirrored training with the plain Keras idiom, on logical CPUs: no GPU needed.

    python examples/mirrored.py                               # 2 replicas: the CPU split in two
    python examples/mirrored.py --virtual_cpus 4 --epochs 4
    python examples/mirrored.py --global_batch_size 63        # 32 + 31 examples a step
    TF_USE_LEGACY_KERAS=1 python examples/mirrored.py         # the same with tf_keras

`tfdist.make_strategy("mirrored")` returns a tf.distribute.MirroredStrategy with one replica
per logical CPU (per GPU, on a machine with GPUs). The model is built and compiled inside
`strategy.scope()`; `fit`, `evaluate` and `predict` are Keras's own, called with the global
batch size, which the replicas share. Batches that do not split evenly over the replicas (an
odd global batch here, the last batch of an epoch, the `validation_split` batches) are fine;
on Keras 3 without tfdist, a first batch that does not split evenly stops `fit` with `AddN
must have the same size and shape`. Prints the replicas, the last epoch's validation
accuracy and the held-out accuracy on scikit-learn's digits (chance: 0.100).
"""

import digits
from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
digits.define_flags(epochs=8)  # --epochs, --global_batch_size, --learning_rate
flags.DEFINE_integer(
    "virtual_cpus",
    2,
    "Split the CPU into this many logical devices, one "
    "replica each; 0 keeps the devices as they are (e.g. on GPUs).",
)


def main(argv):
    del argv
    if FLAGS.virtual_cpus:
        tfdist.virtual_cpus(FLAGS.virtual_cpus)  # before anything starts TensorFlow
    strategy = tfdist.make_strategy("mirrored")
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    print(
        f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replicas on "
        f"{', '.join(strategy.extended.worker_devices)}",
        flush=True,
    )

    (x_train, y_train), (x_test, y_test) = digits.load()
    with strategy.scope():  # the variables, the optimizer and the metrics: one copy a replica
        model = digits.dense_model()
        model.compile(
            optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    history = model.fit(
        x_train,
        y_train,
        validation_split=0.1,
        epochs=FLAGS.epochs,
        batch_size=FLAGS.global_batch_size,
    )
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=FLAGS.global_batch_size, verbose=0)
    predicted = model.predict(x_test[:10], batch_size=FLAGS.global_batch_size, verbose=0)
    print(f"validation accuracy (last epoch) {history.history['val_accuracy'][-1]:.3f}")
    print(
        f"first 10 held-out digits: {y_test[:10].tolist()}, "
        f"predicted {predicted.argmax(axis=1).tolist()}"
    )
    print(
        f"{type(strategy).__name__}: held-out accuracy {accuracy:.3f} (chance 0.100), "
        f"loss {loss:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    app.run(main)
