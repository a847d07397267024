"""What the examples share: scikit-learn's handwritten digits, two models, three flags.

    import digits

    digits.define_flags(epochs=8)         # --epochs, --global_batch_size, --learning_rate
    (x_train, y_train), (x_test, y_test) = digits.load()
    model = digits.dense_model()          # or digits.embedding_model(): build it in a scope

The digits are 1797 images of 8x8 pixels (intensities 0..16), 10 classes, shipped inside
scikit-learn, so nothing is downloaded. `load` shuffles them with a fixed seed and holds out
20%: every process of a job gets the same arrays in the same order.

The models are returned uncompiled, so that each example shows its own `compile` call, and
their last layer computes in float32 (what mixed precision needs; a no-op otherwise).

TensorFlow is imported inside the functions that use it, not at the top: importing this module
starts nothing (`tfdist.virtual_cpus` and `tfdist.make_strategy` may come after it), and
TensorFlow, imported after `app.run` has set up absl logging, prints each log line once.
"""

import numpy as np
from absl import flags, logging

NUM_CLASSES = 10
NUM_PIXELS = 64
LEVELS = 17  # a pixel's intensity is one of 0..16


def define_flags(epochs):
    """Defines the flags every example has: --epochs, --global_batch_size, --learning_rate.

    Also lowers absl's logging to warnings, so that TensorFlow's INFO lines are not printed
    (`--verbosity 0` brings them back).
    """
    flags.DEFINE_integer("epochs", epochs, "Training epochs.")
    flags.DEFINE_integer("global_batch_size", 64, "Examples per training step, over all replicas.")
    flags.DEFINE_float("learning_rate", 0.01, "Adam learning rate.")
    logging.set_verbosity(logging.WARNING)  # before app.run: the --verbosity flag still wins


def load(test_fraction=0.2, seed=0):
    """((x_train, y_train), (x_test, y_test)): pixels in [0, 1] as float32, labels as int32."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images.reshape(-1, NUM_PIXELS) / 16.0).astype("float32")
    y = data.target.astype("int32")
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int((1.0 - test_fraction) * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def dense_model(hidden=64):
    """A multilayer perceptron: 64 pixels -> `hidden` ReLU units -> 10 class probabilities."""
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    inputs = keras.Input((NUM_PIXELS,), name="pixels")
    return _classifier(keras, inputs, inputs, hidden, name="digits_dense")


def embedding_model(dim=32, hidden=64):
    """A bag of embeddings: one table row per (pixel position, intensity), summed, then an MLP.

    The table ("pixel_embedding") has 64 x 17 rows of `dim` floats (136 KiB for dim=32), far
    more than the rest of the model (11 KiB): the variable that a parameter-server job shards
    over its ps tasks.
    """
    import tensorflow as tf

    keras = tf.keras
    inputs = keras.Input((NUM_PIXELS,), name="pixels")
    # pixel p with intensity v (0..16) -> row 17 * p + v of the table
    tokens = keras.layers.Lambda(
        lambda x: tf.cast(tf.round(x * 16.0), tf.int32) + LEVELS * tf.range(NUM_PIXELS),
        name="pixel_tokens",
    )(inputs)
    rows = keras.layers.Embedding(NUM_PIXELS * LEVELS, dim, name="pixel_embedding")(tokens)
    bag = keras.layers.Lambda(lambda rows: tf.reduce_sum(rows, axis=1), name="sum")(rows)
    return _classifier(keras, inputs, bag, hidden, name="digits_embedding")


def _classifier(keras, inputs, features, hidden, name):
    """`features` -> `hidden` ReLU units -> 10 class probabilities, in float32."""
    x = keras.layers.Dense(hidden, activation="relu", name="hidden")(features)
    outputs = keras.layers.Dense(
        NUM_CLASSES, activation="softmax", dtype="float32", name="probabilities"
    )(x)
    return keras.Model(inputs, outputs, name=name)
