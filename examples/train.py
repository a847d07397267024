"""Train a digit classifier with tfdist, on any strategy, in any role of any job.

The same script runs unchanged everywhere; only the environment differs:

    python examples/train.py --virtual_cpus 2             # mirrored on 2 logical CPUs
    tfdist launch --workers 2 examples/train.py           # multi_worker_mirrored, 2 processes
    tfdist launch --workers 2 --ps 1 examples/train.py    # parameter_server (chief trains)
    srun python examples/train.py                         # SLURM (examples/slurm/)
    # Kubernetes TFJob: TF_CONFIG per replica              (examples/kubernetes/)

Data: scikit-learn's handwritten digits (8x8 images, 10 classes), shipped inside the package,
so nothing is downloaded. 80% trains, 20% is held out.
"""

import os

from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
flags.DEFINE_string("strategy", "auto", "tfdist strategy name (auto picks from the cluster).")
flags.DEFINE_integer("virtual_cpus", 0, "Split the CPU into this many logical devices.")
flags.DEFINE_integer("epochs", 8, "Training epochs.")
flags.DEFINE_integer("global_batch_size", 64, "Batch size over all replicas.")
flags.DEFINE_float("learning_rate", 0.01, "Adam learning rate.")
flags.DEFINE_string("precision", "float32", "Keras policy name, or auto.")
flags.DEFINE_integer("embedding_shards", 0,
                     "parameter_server: shard the pixel embedding over the ps tasks when > 0 "
                     "(a partitioner with this many shards at most).")
flags.DEFINE_string("model_dir", "", "Where the chief saves the trained model (.keras).")


def load_digits():
    import numpy as np
    from sklearn.datasets import load_digits as digits

    data = digits()
    x = (data.images.reshape(-1, 64) / 16.0).astype("float32")
    y = data.target.astype("int32")
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def build_model():
    import tensorflow as tf

    from tfdist import _compat

    keras = _compat.keras()
    inputs = keras.Input((64,))
    # Quantised pixel intensities (0..16) per position, embedded: a table that the
    # parameter_server example shards over its ps tasks.
    tokens = keras.layers.Lambda(
        lambda x: tf.cast(tf.round(x * 16.0), tf.int32) + 17 * tf.range(64))(inputs)
    embedded = keras.layers.Embedding(17 * 64, 16)(tokens)
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(embedded))
    outputs = keras.layers.Dense(10, activation="softmax", dtype="float32")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
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
    (x_train, y_train), (x_test, y_test) = load_digits()
    steps = len(x_train) // FLAGS.global_batch_size
    history = tfdist.fit(build_model, (x_train, y_train), strategy=strategy,
                         epochs=FLAGS.epochs, steps_per_epoch=steps,
                         global_batch_size=FLAGS.global_batch_size, shuffle=True, seed=0)
    test_steps = len(x_test) // FLAGS.global_batch_size
    results = tfdist.evaluate(history.model, (x_test, y_test), strategy=strategy,
                              steps=test_steps, global_batch_size=FLAGS.global_batch_size)
    if spec.is_chief:
        print(f"{type(strategy).__name__}: held-out accuracy {results['accuracy']:.3f} "
              f"(chance 0.100), loss {results['loss']:.3f}", flush=True)
        if FLAGS.model_dir:
            os.makedirs(FLAGS.model_dir, exist_ok=True)
            path = os.path.join(FLAGS.model_dir, "digits.weights.h5")
            history.model.save_weights(path)
            print(f"weights saved to {path}", flush=True)


if __name__ == "__main__":
    app.run(main)
