"""Does the digits classifier train the same under every strategy? `tfdist verify` says.

    tfdist verify examples/testing/digits_same_training.py

trains `build_model()` with model.fit under one_device, mirrored (2 virtual CPUs),
multi_worker_mirrored (2 local processes) and parameter_server (1 worker, 1 ps), from the same
initial weights on the same batches, and prints, quantity by strategy, the largest difference
from one device: the weights, the optimizer's state, the metrics' variables, `iterations` and
the logged loss and accuracy, after every step. Dropout is switched off in every run (its masks
cannot be equal).

A test does the same with `tfdist.testing.assert_same_training(build_model, data(),
global_batch_size=GLOBAL_BATCH_SIZE)`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import digits  # noqa: E402  (examples/digits.py: the data)

GLOBAL_BATCH_SIZE = 64
STEPS = 4  # per epoch
EPOCHS = 2


def build_model():
    """Called inside each strategy's scope: build, compile, return."""
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    inputs = keras.Input((digits.NUM_PIXELS,), name="pixels")
    x = keras.layers.Dense(64, activation="relu", use_bias=False, name="hidden")(inputs)
    # synchronized=True: normalise with the global batch's statistics, as one device does
    # (no bias before it: its gradient is 0, and Adam would step on rounding noise)
    x = keras.layers.BatchNormalization(synchronized=True, name="norm")(x)
    x = keras.layers.Dropout(0.2, name="dropout")(x)
    outputs = keras.layers.Dense(digits.NUM_CLASSES, activation="softmax", name="probabilities")(x)
    model = keras.Model(inputs, outputs, name="digits")
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def data():
    """The first 8 batches of the training set, in order."""
    (x, y), _ = digits.load()
    n = GLOBAL_BATCH_SIZE * STEPS * EPOCHS
    return x[:n], y[:n]
