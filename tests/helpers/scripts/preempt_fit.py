"""A Keras job with tfdist.BackupAndRestore that one task preempts with SIGTERM at a chosen step.

    python preempt_fit.py OUT BACKUP [--api keras|tfdist] [--signal TASK:STEP] [--epochs E]
                          [--save-freq K] [--steps-per-epoch S] [--no-backup] [--batch B]
                          [--fail TASK=FILE] [--step-sleep SECONDS] [--epoch-callbacks]

The same command in every task (TF_CONFIG differs), or alone. With --signal worker:1:15, task
worker:1 sends itself SIGTERM once `optimizer.iterations` is 15, the first time only (a marker
file in OUT). The data are 96 examples in a fixed order, in global batches of 8 (12 steps an
epoch); with --steps-per-epoch the data repeat and each epoch trains that many steps. At the end
each task writes OUT/<task>.json: the weights, `iterations`, and the steps it trained itself
(not the ones it skipped). OUT/training appears once the first step has trained, and each
run appends "<task> <number of workers> <pid>" to OUT/runs.log. With --fail worker:2=FILE, task
worker:2 dies (exit 1) at its third step while FILE exists.

With --epoch-callbacks the script's own callback has epoch hooks only (so that tfdist may run
several steps per call): the signal is then sent once the task's input pipeline has made STEP
batches, "trained" is not counted, and OUT/<task>.json records the steps per call of each epoch.
"""

import argparse
import json
import os
import signal
import time

import numpy as np

import tfdist


def problem(keras, tf, batch=8):
    """The data (96 examples in a fixed order, batched) and `build()`, a compiled model with
    fixed initial weights: the same in every task and every run."""
    rng = np.random.RandomState(0)
    x = rng.rand(96, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]]) + 0.1 * rng.rand(96, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    kernel0 = rng.uniform(-0.5, 0.5, (4, 8)).astype("float32")
    kernel1 = rng.uniform(-0.5, 0.5, (8, 1)).astype("float32")

    def build():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        model.set_weights([kernel0, np.zeros(8, "float32"), kernel1, np.zeros(1, "float32")])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
        return model

    return data, build


def write_result(path, model, trained, per_call=(), strategy=None):
    """The weights, `iterations`, the number of steps this run trained, the steps per call
    of each epoch (with --epoch-callbacks) and whether `strategy` sums through Gloo, as JSON."""
    from tfdist.strategy import gloo

    with open(path, "w") as f:
        json.dump(
            {
                "weights": [w.tolist() for w in model.get_weights()],
                "iterations": int(model.optimizer.iterations.numpy()),
                "trained": len(trained),
                "steps_per_call": list(per_call),
                "gloo": strategy is not None and gloo.group_of(strategy) is not None,
            },
            f,
        )


def signal_at_batch(tf, signal_at, task, marker):
    """A map over the batches that sends this task SIGTERM once it has made the batch number
    given by `signal_at` ("TASK:STEP"), the first time only (the marker file)."""
    who, _, step = (signal_at or "").rpartition(":")
    made = [0]

    def count(x):
        made[0] += 1
        if who == task and made[0] == int(step) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
        return x

    def mapped(x, y):
        x = tf.numpy_function(count, [x], tf.float32, stateful=True)
        return tf.ensure_shape(x, [None, 4]), y

    return mapped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("backup")
    parser.add_argument("--api", default="keras", choices=("keras", "tfdist"))
    parser.add_argument("--signal", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    parser.add_argument("--no-backup", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--fail", default=None, help="TASK=FILE: TASK dies while FILE exists")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--epoch-callbacks", action="store_true")
    args = parser.parse_args()
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)

    strategy = tfdist.make_strategy()
    import tensorflow as tf

    from tfdist import flavour

    keras = flavour.keras()
    task = tfdist.detect_cluster().task or "single"
    data, build = problem(keras, tf, args.batch)
    if args.steps_per_epoch:
        data = data.repeat()

    marker = os.path.join(args.out, "signalled")
    trained = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if logs:  # steps skipped on resume have no logs
                trained.append(batch)
            if len(trained) == 1:
                open(os.path.join(args.out, "training"), "w").close()
                with open(os.path.join(args.out, "runs.log"), "a") as f:
                    f.write(f"{task} {tfdist.detect_cluster().num_workers} {os.getpid()}\n")
            if logs and args.step_sleep:
                time.sleep(args.step_sleep)
            if args.fail and len(trained) == 3:
                who, _, path = args.fail.partition("=")
                if who == task and os.path.exists(path):
                    os._exit(1)  # a worker slot that is lost for good, while the file exists
            if args.signal and not os.path.exists(marker):
                who, _, step = args.signal.rpartition(":")
                if who == task and int(self.model.optimizer.iterations.numpy()) == int(step):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGTERM)

    per_call = []

    class RecordEpochs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            per_call.append(int(self.model.steps_per_execution))

    if args.epoch_callbacks:
        data = data.map(signal_at_batch(tf, args.signal, task, marker))
    callbacks = [RecordEpochs() if args.epoch_callbacks else Record()]
    if not args.no_backup:
        callbacks.insert(0, tfdist.BackupAndRestore(args.backup, save_freq=save_freq))
    if args.api == "keras":
        with strategy.scope():
            model = build()
        model.fit(
            data,
            epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            callbacks=callbacks,
            verbose=0,
        )
    else:
        model = tfdist.fit(
            build,
            data,
            epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            callbacks=callbacks,
            verbose=0,
        ).model
    path = os.path.join(args.out, task.replace(":", "-") + ".json")
    write_result(path, model, trained, per_call, strategy)


if __name__ == "__main__":
    main()
