"""A multi_worker_mirrored fit that reports what its task saw, for the multi-node jobs' test.

    python nodes_report.py OUT_DIR

Each task writes OUT_DIR/<type>-<index>.json: its TF_CONFIG, the replicas in sync, whether the
rendezvous token reached its environment, and the sum of its final weights.
"""

import json
import os
import sys

import numpy as np

import tfdist


def main(out_dir):
    strategy = tfdist.make_strategy()
    from tfdist import flavour

    keras = flavour.keras()
    rng = np.random.RandomState(0)
    x = rng.rand(256, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    task = tfdist.detect_cluster().task
    report = {
        "TF_CONFIG": json.loads(os.environ["TF_CONFIG"]),
        "replicas": strategy.num_replicas_in_sync,
        "token_seen": any("the-job-token" in value for value in os.environ.values()),
        "weights": float(sum(w.sum() for w in model.get_weights())),
    }
    with open(os.path.join(out_dir, task.replace(":", "-") + ".json"), "w") as f:
        json.dump(report, f)
    print(f"{task}: {strategy.num_replicas_in_sync} replicas in sync", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
