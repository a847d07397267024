"""The chief of a parameter-server job training with tfdist.BackupAndRestore, that sends itself
SIGTERM once `optimizer.iterations` reaches a chosen step.

    python preempt_ps_fit.py OUT BACKUP PHASE [--signal-at N] [--save-freq F]

Runs on the chief (the coordinator) of a job whose worker and ps tasks run `tfdist serve`.
tfdist.fit trains EPOCHS epochs of STEPS steps in groups of K (the model's
steps_per_execution), on inputs that each worker reads at one batch every PACE_MS. With
--signal-at N a thread sends this process SIGTERM once `optimizer.iterations` >= N. The
callbacks have no batch hooks, so tfdist's loop reads no group's logs.

Writes OUT/PHASE.json: `at_start` (the iterations, weights and, under Keras 3, optimizer
variables right after BackupAndRestore restored the backup), `at_exit` (the same, when fit
ended or raised tfdist.Preempted), `epochs` (those that ended), `exit` ("done" or
"preempted", with the epoch and step of Preempted) and `runs` (under Keras 3: each train run of
tfdist's runner, with whether it read every group's logs and how many groups it kept in flight).
"""

import argparse
import faulthandler
import json
import os
import signal
import threading
import time

import numpy as np

import tfdist

FEATURES, BATCH = 4, 16
EPOCHS, STEPS, K = 3, 40, 2
PACE_MS = 25


def dataset_fn(input_context):
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as data_testing

    rng = np.random.RandomState(input_context.input_pipeline_id)
    x = rng.rand(512, FEATURES).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]])).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    # one batch every PACE_MS on each worker, none prefetched ahead of the steps
    dataset = dataset.repeat().apply(data_testing.sleep(PACE_MS * 1000))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def _snapshot(model, legacy):
    snapshot = {
        "iterations": int(model.optimizer.iterations.numpy()),
        "weights": [w.numpy().tolist() for w in model.weights],
    }
    if not legacy:  # tf_keras makes its slot variables at the first step
        snapshot["optimizer"] = [v.numpy().tolist() for v in model.optimizer.variables]
    return snapshot


def main():
    faulthandler.enable()  # every thread's stack, should it crash
    faulthandler.register(signal.SIGUSR1)  # and should it hang
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("backup")
    parser.add_argument("phase")
    parser.add_argument("--signal-at", type=int, default=None)
    parser.add_argument("--save-freq", default="epoch")
    args = parser.parse_args()
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)

    strategy = tfdist.make_strategy()  # parameter_server, from TF_CONFIG
    from tfdist import flavour

    keras = flavour.keras()
    legacy = flavour.uses_legacy_keras()
    result = {"epochs": [], "runs": [], "flavour": "tf_keras" if legacy else "keras3"}
    models = []

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.5),
            loss="mse",
            steps_per_execution=K,
        )
        models.append(model)
        return model

    class Record(keras.callbacks.Callback):  # epoch-level hooks only
        def on_train_begin(self, logs=None):  # after BackupAndRestore's: restored
            result["at_start"] = _snapshot(self.model, legacy)

        def on_epoch_end(self, epoch, logs=None):
            result["epochs"].append(epoch)

    if not legacy:
        from tfdist.parameter_server import runner

        run = runner._Runner.run

        def recording_run(self, mode, *a, **kw):
            if mode == "train":
                result["runs"].append(
                    {"batch_hooks": kw.get("batch_hooks"), "ahead": kw.get("ahead")}
                )
            return run(self, mode, *a, **kw)

        runner._Runner.run = recording_run

    stop = threading.Event()

    def signal_at(step):
        while not stop.is_set():
            if models and int(models[0].optimizer.iterations.numpy()) >= step:
                result["signalled_at"] = int(models[0].optimizer.iterations.numpy())
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    if args.signal_at is not None:
        threading.Thread(target=signal_at, args=(args.signal_at,), daemon=True).start()

    def write():
        with open(os.path.join(args.out, args.phase + ".json"), "w") as f:
            json.dump(result, f)

    try:
        tfdist.fit(
            build,
            dataset_fn,
            strategy=strategy,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=[tfdist.BackupAndRestore(args.backup, save_freq=save_freq), Record()],
            verbose=0,
        )
    except tfdist.Preempted as preempted:
        stop.set()
        result["exit"] = {"how": "preempted", "epoch": preempted.epoch, "step": preempted.step}
        result["at_exit"] = _snapshot(models[0], legacy)
        write()
        raise
    stop.set()
    result["exit"] = {"how": "done"}
    result["at_exit"] = _snapshot(models[0], legacy)
    write()


if __name__ == "__main__":
    main()
