"""A Horovod custom training loop: hvd.DistributedGradientTape, and the variables broadcast
from rank 0 after the first step (when the optimizer has made its slots), as in Horovod's
TensorFlow 2 examples.

    tfdist horovodrun -np 2 python examples/horovod/custom_loop.py --out /tmp/hvd_loop

Each process takes every size-th example and a batch of GLOBAL_BATCH_SIZE / size.
"""

import argparse
import json
import os

import horovod.tensorflow as hvd
import numpy as np

hvd.init()

import tensorflow as tf  # noqa: E402


def synthetic_data(n=1024, features=32, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, 1)).astype("float32")
    y = (np.tanh(x @ w) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="hvd_loop")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    x, y = synthetic_data()
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shard(hvd.size(), hvd.rank())
        .repeat()
        .batch(args.global_batch_size // hvd.size())
    )
    tf.keras.utils.set_random_seed(args.seed)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(x.shape[1],)),
            tf.keras.layers.Dense(32, activation="tanh"),
            tf.keras.layers.Dense(1),
        ]
    )
    loss_fn = tf.keras.losses.MeanSquaredError()
    opt = tf.keras.optimizers.Adam(args.lr)

    @tf.function
    def training_step(features, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # The optimizer's slots exist now: every rank takes rank 0's model and optimizer.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return hvd.allreduce(loss)

    losses = []
    for step, (features, labels) in enumerate(dataset.take(args.steps)):
        losses.append(float(training_step(features, labels, step == 0)))
        if step % 10 == 0 and hvd.rank() == 0:
            print(f"step {step}: loss {losses[-1]:.4f}")
    np.savez(os.path.join(args.out, f"weights-rank{hvd.rank()}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"losses-rank{hvd.rank()}.json"), "w") as f:
        json.dump(losses, f)
    print(f"rank {hvd.rank()} of {hvd.size()}: loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
