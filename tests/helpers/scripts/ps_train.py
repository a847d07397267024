"""One training script for every role of a parameter-server job.

    python ps_train.py OUT_DIR [EPOCHS]

Every task of the job (chief, workers, ps) runs this file unchanged, each with its own
TF_CONFIG, as a Kubernetes TFJob starts the same command in each replica. The script does not
look at its role: `tfdist.make_strategy()` does. In a worker or ps task it serves and never
returns; in the chief it returns a ParameterServerStrategy and the script trains and evaluates
with tfdist's `fit` / `evaluate`, which drive the workers through a ClusterCoordinator.

Records, for the test: OUT_DIR/<type>-<index>.started (this task's TF_CONFIG and pid) before
make_strategy, OUT_DIR/<type>-<index>.trains after it (the chief only), and the chief's
results in OUT_DIR/result.json.
"""

import json
import os
import sys

import numpy as np

import tfdist

FEATURES, CLASSES, BATCH = 8, 3, 64


def _record(out_dir, name, payload):
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def build_model():
    from tfdist import flavour

    keras = flavour.keras()
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def main(out_dir, epochs):
    task = tfdist.detect_cluster().task or "local"
    name = task.replace(":", "-")
    _record(
        out_dir,
        f"{name}.started",
        {"TF_CONFIG": os.environ.get("TF_CONFIG"), "pid": os.getpid(), "argv": sys.argv},
    )
    strategy = tfdist.make_strategy()  # a worker or ps task serves here until the job ends
    _record(out_dir, f"{name}.trains", {"pid": os.getpid()})

    from tfdist.training import evaluate, fit

    rng = np.random.RandomState(0)
    x = rng.randn(4096, FEATURES).astype("float32")
    y = np.argmax(x @ rng.randn(FEATURES, CLASSES), axis=1).astype("int32")
    steps = 3072 // BATCH
    history = fit(
        build_model,
        (x[:3072], y[:3072]),
        strategy=strategy,
        epochs=epochs,
        steps_per_epoch=steps,
        global_batch_size=BATCH,
        shuffle=True,
        seed=0,
        verbose=2,
    )
    model = history.model
    results = evaluate(
        model,
        (x[3072:], y[3072:]),
        strategy=strategy,
        steps=1024 // BATCH,
        global_batch_size=BATCH,
        verbose=0,
    )
    variables = model.weights + model.optimizer.variables
    _record(
        out_dir,
        "result.json",
        {
            "task": task,
            "strategy": type(strategy).__name__,
            "workers": strategy.extended._num_workers,
            "steps_per_epoch": steps,
            "iterations": int(model.optimizer.iterations.numpy()),
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "evaluate": {k: float(v) for k, v in results.items()},
            "variable_devices": sorted({getattr(v, "_value", v).device for v in variables}),
        },
    )
    print(f"{task}: trained {epochs} epoch(s), held-out accuracy {results['acc']:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
