"""A Horovod Keras training script: model.fit with hvd.DistributedOptimizer, Horovod's three
callbacks and checkpoints written by rank 0 only.

It imports Horovod as Horovod scripts do; `tfdist horovodrun` gives it tfdist's Horovod API
where Horovod is not installed:

    tfdist horovodrun -np 2 python examples/horovod/keras_fit.py --out /tmp/hvd_fit

Each process trains on its shard of the data (every size-th example) with a batch of
GLOBAL_BATCH_SIZE / size, so that 1 and 2 processes take the same steps. It runs on Keras 3 and
on tf_keras (TF_USE_LEGACY_KERAS=1) alike.
"""

import argparse
import json
import os

import horovod.tensorflow.keras as hvd
import numpy as np

hvd.init()

import tensorflow as tf  # noqa: E402  (after hvd.init(), as in Horovod's examples)


def synthetic_data(n=1024, features=32, classes=4, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    teacher = rng.normal(size=(features, classes)).astype("float32")
    y = np.argmax(x @ teacher + 0.5 * rng.normal(size=(n, classes)), axis=1).astype("int64")
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--compression", choices=("none", "fp16", "bf16"), default="none")
    parser.add_argument(
        "--backward-passes-per-step", type=int, default=1, help="apply every N steps"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="hvd_fit")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    x, y = synthetic_data()
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    tf.keras.utils.set_random_seed(args.seed)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(x.shape[1],)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(4, activation="softmax"),
        ]
    )
    opt = tf.keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        opt,
        compression=getattr(hvd.Compression, args.compression),
        backward_passes_per_step=args.backward_passes_per_step,
        average_aggregated_gradients=True,
    )
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=args.lr, warmup_epochs=args.warmup_epochs, verbose=1
        ),
    ]
    if hvd.rank() == 0:  # one writer
        path = os.path.join(args.out, "checkpoint-{epoch}.weights.h5")
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True))

    history = model.fit(
        x,
        y,
        batch_size=args.global_batch_size // hvd.size(),
        epochs=args.epochs,
        callbacks=callbacks,
        shuffle=False,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    np.savez(os.path.join(args.out, f"weights-rank{hvd.rank()}.npz"), *model.get_weights())
    logs = {k: [float(v) for v in values] for k, values in history.history.items()}
    with open(os.path.join(args.out, f"history-rank{hvd.rank()}.json"), "w") as f:
        json.dump(
            {
                "history": logs,
                "iterations": int(model.optimizer.iterations.numpy()),
                "payload_bytes": hvd.payload_bytes(),
            },
            f,
        )
    print(f"rank {hvd.rank()} of {hvd.size()}: loss {logs['loss'][-1]:.4f}")


if __name__ == "__main__":
    main()
