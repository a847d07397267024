"""The job of a fault-injection trial (tests/chaos/campaign.py), run under `tfdist launch`.

    tfdist launch --workers N [--ps M] chaos_job.py OUT BACKUP

multi_worker_mirrored (no ps) trains with Keras `model.fit`, parameter_server with
`tfdist.fit`, both with tfdist.BackupAndRestore(BACKUP, save_freq=SAVE_FREQ), EPOCHS epochs of
STEPS steps, one step at least every PACE seconds (so that a fault lands mid-training). The
task that leads (worker 0, or the chief) writes:

- OUT/progress: its optimizer step, rewritten whenever it changes (the campaign times the
  faults and the recoveries on it);
- OUT/starts.log: a line per start of training, "PID STEP", STEP the optimizer step the backup
  restored (0: no backup, a start from scratch); the campaign checks on it that a corrupt
  newest backup fell back to the one before;
- OUT/final.json: once training ended, the optimizer step and the weights.

Under multi_worker_mirrored the strategy spreads each global batch of BATCH examples over the
workers: where a run stopped and resumed changes nothing, but the worker count changes how the
gradient sums are split and added up, hence the last bits of the weights, so the campaign
compares a trial with an uninterrupted run of the same worker count.

Set CHAOS_EPOCHS, CHAOS_STEPS to change the length. Keras 3 or tf_keras (TF_USE_LEGACY_KERAS).
"""

import json
import os
import sys
import threading
import time

import numpy as np

import tfdist

FEATURES, BATCH, WIDTH = 8, 16, 64
EPOCHS = int(os.environ.get("CHAOS_EPOCHS", "3"))
STEPS = int(os.environ.get("CHAOS_STEPS", "10"))
SAVE_FREQ = 2
PACE = 0.1  # seconds per step at least


def _data(seed):
    rng = np.random.RandomState(seed)
    x = rng.rand(STEPS * BATCH, FEATURES).astype("float32")
    y = (x @ rng.rand(FEATURES, 1)).astype("float32")
    return x, y


def _build(keras, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.5),
        loss="mse",
        steps_per_execution=steps_per_execution,
    )
    return model


def _write(path, text):
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def _watch(models, out, stop):
    """Writes the leader's optimizer step to OUT/progress whenever it changes."""
    last = None
    while not stop.wait(0.02):
        if not models:
            continue
        try:
            step = int(models[0].optimizer.iterations.numpy())
        except Exception:  # pylint: disable=broad-except  (a parameter server went away)
            continue
        if step != last:
            _write(os.path.join(out, "progress"), str(step))
            last = step


def main(out, backup):
    strategy = tfdist.make_strategy()
    import tensorflow as tf

    from tfdist import flavour

    keras = flavour.keras()
    spec = tfdist.detect_cluster()
    leads = spec.is_chief
    parameter_server = bool(spec.num_ps)
    models = []

    class Record(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after BackupAndRestore's: restored
            if leads:
                with open(os.path.join(out, "starts.log"), "a") as f:
                    step = int(self.model.optimizer.iterations.numpy())
                    f.write(f"{os.getpid()} {step}\n")

    class Pace(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            time.sleep(PACE)

    callbacks = [tfdist.BackupAndRestore(backup, save_freq=SAVE_FREQ), Record()]
    stop = threading.Event()
    if leads:
        threading.Thread(target=_watch, args=(models, out, stop), daemon=True).start()
    if parameter_server:

        def build():
            model = _build(keras)
            models.append(model)
            return model

        def dataset_fn(input_context):
            from tensorflow.python.data.experimental.ops import testing as data_testing

            x, y = _data(input_context.input_pipeline_id)
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
            return dataset.apply(data_testing.sleep(int(PACE * 1e6)))

        tfdist.fit(
            build,
            dataset_fn,
            strategy=strategy,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=callbacks,
            verbose=0,
        )
    else:
        with strategy.scope():
            models.append(_build(keras))
        x, y = _data(0)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        models[0].fit(data, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[*callbacks, Pace()])
    stop.set()
    if leads:
        model = models[0]
        final = {
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights": [w.numpy().tolist() for w in model.weights],
        }
        _write(os.path.join(out, "final.json"), json.dumps(final))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
