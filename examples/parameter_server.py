"""Parameter-server training of a model whose Embedding table is sharded over 2 ps tasks.

    tfdist launch --workers 2 --ps 2 examples/parameter_server.py      # chief + 2 workers + 2 ps
    tfdist launch --workers 2 --ps 2 examples/parameter_server.py --epochs 2
    tfdist launch --workers 2 --ps 1 examples/parameter_server.py      # the whole table on ps:0

The chief runs this script: it builds the model in the strategy's scope, so every variable
lives on the ps tasks, and schedules training steps on whichever worker is free. Variables of
at least twice `--min_shard_bytes` (64 KiB) are split into shards, at most one per ps task:
here the 136 KiB table of `digits.embedding_model`, and nothing else. `tfdist.fit` trains,
`steps_per_execution` steps per scheduled call, and `tfdist.evaluate` evaluates: the calls
that work the same on every strategy (Keras 3's own `model.fit` has no parameter-server
support; tfdist adds it, see docs/strategies/parameter-server.md). The chief prints where
each shard of the table lives and the held-out accuracy on scikit-learn's digits (chance:
0.100).

The worker and ps tasks only serve: `tfdist.make_strategy()` runs their server and never
returns there, so the same command works in every role, as in a Kubernetes TFJob
(examples/kubernetes/). `tfdist launch --ps` starts them as plain servers (`tfdist serve`).
"""

import math

import digits
from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
digits.define_flags(epochs=4)  # --epochs, --global_batch_size, --learning_rate
flags.DEFINE_integer("steps_per_execution", 2, "Training steps per call scheduled on a worker.")
flags.DEFINE_integer(
    "min_shard_bytes",
    64 << 10,
    "Variables of at least twice this size are "
    "split into shards of at least this size, at most one per ps task.",
)


def main(argv):
    del argv
    strategy = tfdist.make_strategy(
        "parameter_server", variable_partitioner="min_size", min_shard_bytes=FLAGS.min_shard_bytes
    )  # workers, ps: serve
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    spec = tfdist.detect_cluster()
    print(
        f"{type(strategy).__name__}: chief coordinating {spec.num_workers} workers and "
        f"{spec.num_ps} ps tasks",
        flush=True,
    )

    def build_model():  # called by tfdist.fit inside strategy.scope()
        model = digits.embedding_model()
        model.compile(
            optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=FLAGS.steps_per_execution,
        )
        return model

    (x_train, y_train), (x_test, y_test) = digits.load()
    steps = math.ceil(len(x_train) / FLAGS.global_batch_size)  # what tfdist.fit defaults to
    history = tfdist.fit(
        build_model,
        (x_train, y_train),
        strategy=strategy,
        epochs=FLAGS.epochs,
        global_batch_size=FLAGS.global_batch_size,
        shuffle=True,
        seed=0,
    )  # an epoch: one pass over the examples
    model = history.model

    table = model.get_layer("pixel_embedding").embeddings
    print(
        f"pixel_embedding table {'x'.join(map(str, table.shape))}, "
        f"{len(shards(keras, table))} shard(s):"
    )
    first = 0
    for shard in shards(keras, table):
        device = tf.DeviceSpec.from_string(shard.device)
        rows = shard.shape[0]
        print(f"  rows {first:4d}-{first + rows - 1:4d} on {device.job}:{device.task}")
        first += rows
    print(
        f"optimizer steps: {int(model.optimizer.iterations.numpy())} "
        f"({FLAGS.epochs} epochs x {steps})"
    )

    results = tfdist.evaluate(
        model, (x_test, y_test), strategy=strategy, global_batch_size=FLAGS.global_batch_size
    )
    print(
        f"{type(strategy).__name__}: held-out accuracy {results['accuracy']:.3f} "
        f"(chance 0.100), loss {results['loss']:.3f}",
        flush=True,
    )


def shards(keras, weight):
    """The TensorFlow variables that hold a model weight: its shards, or itself."""
    if isinstance(weight, getattr(keras, "Variable", ())):  # Keras 3 wraps a tf.Variable
        weight = weight.value
    return list(getattr(weight, "variables", [weight]))  # a ShardedVariable lists its shards


if __name__ == "__main__":
    app.run(main)
