"""mixed_bfloat16 vs float32 training: the data, the model and the comparison of losses, for
the precision tests in the pytest process and in local clusters."""

import numpy as np

# Small enough to keep the tests quick: 256 examples, 4 steps an epoch, 5 epochs.
GLOBAL_BATCH, EPOCHS, LEARNING_RATE = 64, 5, 0.2


def regression_data(n=256):
    rng = np.random.default_rng(42)
    x = rng.normal(size=(n, 8)).astype("float32")
    w = rng.normal(size=(8, 1)).astype("float32")
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def build_regression_model(keras):
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def close_losses(a, b, tolerance=0.05):
    """Losses within `tolerance` (relative) of each other, plus a small absolute slack."""
    return abs(a - b) <= tolerance * max(a, b) + 0.005
