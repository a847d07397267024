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

from preempt_fit import problem, write_result  # this directory is on sys.path

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
    data, build = problem(keras, tf)
    with strategy.scope():
        model = build()

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
    write_result(os.path.join(args.model_dir, name + ".json"), model, trained)


if __name__ == "__main__":
    main()
