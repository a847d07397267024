"""Runs a keras.distribution script unmodified and writes what it trained: the harness of
tests/cluster/test_keras_distribution_jobs.py.

    python keras_guide.py SCRIPT OUT_DIR [--cpus N] [--import-tfdist] [--initialize ADDRS ID]

Before the script: the seeds of Python, NumPy and TensorFlow are fixed (the same data and
initial weights in every run and process) and Dropout is switched off (a replica draws other
masks than one device does; the comparison is of everything else). `--cpus N` makes N logical
CPUs (it imports tfdist for that). `--import-tfdist` imports tfdist; without it, tfdist is there
only if the launcher's start-up hook brought it. `--initialize` calls
keras.distribution.initialize(job_addresses=ADDRS, num_processes=..., process_id=ID) first; with
ID "env", the same through KERAS_DISTRIBUTION_* variables instead.

After it: OUT_DIR/<process>.npz holds the model's weights and OUT_DIR/<process>.json the
replicas, processes and devices the script trained on.
"""

import argparse
import json
import os
import runpy
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("script")
    parser.add_argument("out")
    parser.add_argument("--cpus", type=int)
    parser.add_argument("--import-tfdist", action="store_true")
    parser.add_argument("--initialize", nargs=2, metavar=("ADDRS", "ID"))
    args = parser.parse_args()
    if args.cpus:
        import tfdist

        tfdist.virtual_cpus(args.cpus)
    if args.import_tfdist:
        import tfdist  # noqa: F401

    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    dropout_init = keras.layers.Dropout.__init__

    def no_dropout(self, rate, *a, **kw):
        dropout_init(self, 0.0, *a, **kw)

    keras.layers.Dropout.__init__ = no_dropout
    if args.initialize:
        addresses, process = args.initialize
        count = len(addresses.split(","))
        if process == "env":
            os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = addresses
            os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"] = str(count)
            os.environ["KERAS_DISTRIBUTION_PROCESS_ID"] = "1"
            keras.distribution.initialize()
        else:
            keras.distribution.initialize(
                job_addresses=addresses, num_processes=count, process_id=int(process)
            )
    sys.argv = [args.script]
    names = runpy.run_path(args.script, run_name="__main__")
    model = names["model"]
    from keras.src.backend import distribution_lib as backend_lib  # tfdist's, when installed

    process = backend_lib.process_id() if hasattr(backend_lib, "process_id") else 0
    processes = backend_lib.num_processes() if hasattr(backend_lib, "num_processes") else 1
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"{process}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"{process}.json"), "w") as f:
        json.dump(
            {
                "replicas": model.distribute_strategy.num_replicas_in_sync,
                "processes": processes,
                "devices": keras.distribution.list_devices(),
                "iterations": int(model.optimizer.iterations.numpy()),
            },
            f,
        )


if __name__ == "__main__":
    main()
