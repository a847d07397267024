"""A short Keras job with tfdist.BackupAndRestore, for a scheduler to preempt from outside.

    python sched_fit.py --model_dir OUT --backup_dir BACKUP [--epochs E] [--step_seconds T]

The flags of examples/train.py, which it stands in for in the scheduler tests (a few seconds of
training instead of the digits). The same command in every task (the cluster comes from
TF_CONFIG or an srun step), or alone.
The model and data are those of preempt_fit.py: 96 examples in a fixed order, global batches of
8, 12 steps an epoch. Each task:

- writes OUT/<task>.started (JSON: its pid and the cluster variables it got) after the first
  step it trained in this run: a test waits for that file before it sends SIGTERM;
- sleeps T seconds (default 0.15) after every step it trains, so that a SIGTERM sent once
  training has started lands in the middle of it;
- at the end writes OUT/<task>.json: the weights, `iterations`, and the steps it trained in
  this run (not the ones it skipped on resume).

On SIGTERM, every task exits with tfdist.PREEMPTED_EXIT_CODE after the backup is saved.
"""

import argparse
import json
import os
import time

import numpy as np

import tfdist

CLUSTER_VARIABLES = ("TF_CONFIG", "JOB_COMPLETION_INDEX", "SLURM_JOB_ID", "SLURM_PROCID")
CLUSTER_VARIABLES += ("SLURM_STEP_ID", "SLURM_RESTART_COUNT", "TFDIST_SLURM_PORT")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--backup_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step_seconds", type=float, default=0.15)
    args = parser.parse_args()

    strategy = tfdist.make_strategy()
    import tensorflow as tf

    from tfdist import flavour

    keras = flavour.keras()
    task = tfdist.detect_cluster().task or "single"
    name = task.replace(":", "-")
    rng = np.random.RandomState(0)
    x = rng.rand(96, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]]) + 0.1 * rng.rand(96, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    kernel0 = rng.uniform(-0.5, 0.5, (4, 8)).astype("float32")
    kernel1 = rng.uniform(-0.5, 0.5, (8, 1)).astype("float32")
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        model.set_weights([kernel0, np.zeros(8, "float32"), kernel1, np.zeros(1, "float32")])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")

    trained = []

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not logs:  # a step skipped on resume
                return
            trained.append(batch)
            if len(trained) == 1:
                started = {
                    "pid": os.getpid(),
                    "task": task,
                    "iterations": int(self.model.optimizer.iterations.numpy()),
                    "env": {k: os.environ[k] for k in CLUSTER_VARIABLES if k in os.environ},
                }
                partial = os.path.join(args.model_dir, name + ".started.partial")
                with open(partial, "w") as f:
                    json.dump(started, f)
                os.replace(partial, os.path.join(args.model_dir, name + ".started"))
            time.sleep(args.step_seconds)

    os.makedirs(args.model_dir, exist_ok=True)
    model.fit(
        data,
        epochs=args.epochs,
        callbacks=[tfdist.BackupAndRestore(args.backup_dir), Slow()],
        verbose=0,
    )
    with open(os.path.join(args.model_dir, name + ".json"), "w") as f:
        json.dump(
            {
                "weights": [w.tolist() for w in model.get_weights()],
                "iterations": int(model.optimizer.iterations.numpy()),
                "trained": len(trained),
            },
            f,
        )


if __name__ == "__main__":
    main()
