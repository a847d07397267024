"""Horovod's synthetic benchmark, for tfdist's Horovod API: training steps on random data with
hvd.DistributedGradientTape, timed, in examples per second.

    tfdist horovodrun -np 2 python examples/horovod/synthetic_benchmark.py
    tfdist horovodrun -np 2 python examples/horovod/synthetic_benchmark.py --fp16-allreduce

The model is an MLP (`--width`, `--depth`), small enough for CPUs; `--json FILE` writes the
figures, with the bytes each step put on the wire.
"""

import argparse
import json
import timeit

import horovod.tensorflow as hvd
import numpy as np

hvd.init()

import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 on the wire")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--json", help="write the figures here (rank 0)")
    args = parser.parse_args()

    tf.keras.utils.set_random_seed(1234)
    layers = [tf.keras.Input(shape=(args.features,))]
    layers += [tf.keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)]
    layers += [tf.keras.layers.Dense(10)]
    model = tf.keras.Sequential(layers)
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    rng = np.random.RandomState(hvd.rank())
    data = tf.constant(rng.normal(size=(args.batch_size, args.features)).astype("float32"))
    target = tf.constant(rng.randint(0, 10, size=(args.batch_size,)))

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    log(f"Model: MLP {args.depth}x{args.width}, {params / 1e6:.2f}M parameters")
    log(f"Batch size: {args.batch_size} per process; processes: {hvd.size()}")
    log(f"Compression: {'fp16' if args.fp16_allreduce else 'none'}")
    benchmark_step(first_batch=True)
    for _ in range(args.num_warmup_batches):
        benchmark_step(first_batch=False)
    before = hvd.payload_bytes()
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(
            lambda: benchmark_step(first_batch=False).numpy(), number=args.num_batches_per_iter
        )
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {rate:.1f} examples/sec per process")
        rates.append(rate)
    steps = args.num_iters * args.num_batches_per_iter
    per_step = (hvd.payload_bytes() - before) / steps
    mean, spread = float(np.mean(rates)), float(1.96 * np.std(rates))
    log(f"Examples/sec per process: {mean:.1f} +-{spread:.1f}")
    log(f"Total examples/sec on {hvd.size()} processes: {hvd.size() * mean:.1f}")
    log(f"Bytes on the wire per step and process: {per_step:.0f}")
    if args.json and hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "processes": hvd.size(),
                    "parameters": params,
                    "compression": "fp16" if args.fp16_allreduce else "none",
                    "examples_per_second_per_process": rates,
                    "median_examples_per_second": float(np.median(rates)) * hvd.size(),
                    "payload_bytes_per_step": per_step,
                },
                f,
            )


if __name__ == "__main__":
    main()
