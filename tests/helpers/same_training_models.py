"""Model factories and data for tests/cluster/test_same_training.py: what users give
`tfdist.testing.assert_same_training`. Module-level, so that the strategies' processes import
them; Keras is imported inside (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1)."""

import numpy as np

VOCAB = 50


def _keras():
    from tfdist import flavour

    return flavour.keras()


def regression(n=120, seed=0):
    x = np.random.RandomState(seed).randn(n, 4).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]


def sequential_with_dropout():
    """Sequential, Adam, a metric, and a Dropout layer (switched off by the comparison)."""
    keras = _keras()
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def sgd_mlp():
    """Sequential with plain SGD: a wrong gradient moves the weights at once."""
    keras = _keras()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


def tokens(n=120, seed=1):
    """(ids, dense features) -> a class: for the functional model with an Embedding."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, size=(n, 3)).astype("int32")
    dense = rng.randn(n, 4).astype("float32")
    labels = ((ids[:, 0] % 3) + (dense[:, 0] > 0)).astype("int32") % 3
    return {"ids": ids, "features": dense}, labels


def functional_embedding_batch_norm():
    """Functional, two named inputs, an Embedding (sparse gradients), a synchronized
    BatchNormalization, a sparse categorical loss and accuracy."""
    keras = _keras()
    ids = keras.Input((3,), dtype="int32", name="ids")
    features = keras.Input((4,), name="features")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 4)(ids))
    x = keras.layers.Concatenate()([embedded, features])
    x = keras.layers.Dense(16, use_bias=False)(x)  # no bias before a normalisation
    x = keras.layers.BatchNormalization(synchronized=True)(x)
    x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model({"ids": ids, "features": features}, outputs)
    model.compile(
        keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def functional_plain_batch_norm():
    """BatchNormalization without synchronized=True: each replica normalises its own batch."""
    keras = _keras()
    inputs = keras.Input((4,))
    x = keras.layers.Dense(16, use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(x))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def subclassed_with_custom_train_step():
    """A subclassed model (built on its first batch) with its own train_step."""
    keras = _keras()

    class Regressor(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="tanh")
            self.out = keras.layers.Dense(1)
            self.error = keras.metrics.Mean(name="error")

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            import tensorflow as tf

            x, y = data
            with tf.GradientTape() as tape:
                prediction = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=prediction)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            self.error.update_state(tf.abs(y - prediction))
            return {"error": self.error.result()}

    model = Regressor()
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def mixed_float16_mlp():
    """mixed_float16, so the optimizer is a LossScaleOptimizer."""
    keras = _keras()
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def overflowing(n=64):
    """Examples 4..15 of the first batch of 16 overflow float16: on 4 replicas, replicas 1-3."""
    x, y = regression(n)
    y[4:16] *= 1e7
    return x, y


def accumulating_mlp():
    """An optimizer with gradient_accumulation_steps=2."""
    keras = _keras()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(0.01, gradient_accumulation_steps=2), "mse")
    return model
