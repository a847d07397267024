"""Benchmark: tfdist's input pipeline vs a naive one, and mixed_bfloat16 vs float32 training.

    python benchmarks/bench_input.py [--repeats 5] [--examples 65536] [--files 8]

Measured in one run, on this host:

1. Input pipeline alone (no model), examples/s over full passes of a TFRecord dataset of
   tf.train.Example records (a 64-float feature vector and an int label):
   - naive: `from_tensor_slices(files).flat_map(TFRecordDataset).map(parse).batch(B)`
   - tfdist: `tfdist.dataset_fn_for(TFRecordDataset(files), B, map_fn=parse)` on one input
     pipeline (the default per-record path), the same user parse function;
   - tfdist vectorized: `dataset_fn_for(TFRecordDataset(files), B, batch_map_fn=parse_batch)`,
     the parse written for a batch (`tf.io.parse_example`), run on whole batches in parallel;
   - tfdist features: `dataset_fn_for(TFRecordDataset(files), B, features=SPEC,
     batch_map_fn=lambda f: (f["x"], f["y"]))`, the feature spec alone, parsed per batch by
     tfdist;
   - tfdist autotuned: the tfdist case with `autotune.enabled=True` set on the dataset (tfdist
     keeps it), to show what switching autotuning off on small hosts is worth;
   and the same for in-memory arrays (`from_tensor_slices((x, y)).batch(B)` vs
   `dataset_fn_for((x, y), B)`).
2. Training throughput (examples/s, and examples per CPU-second of the process) of one Keras
   MLP, float32 vs mixed_bfloat16, single device, from in-memory data. Both models train in
   one subprocess, alternating epoch by epoch, so that both see the same machine load.

Each figure is the median of `--repeats` timed passes after one warm-up pass; the cases
compared take turns pass by pass. "per CPU-second" divides by the process's CPU time (all
threads), which is steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES = 64
BATCH = 256


def feature_spec() -> dict:
    """The records' feature spec: 64 floats "x" and an int64 label "y"."""
    import tensorflow as tf

    return {
        "x": tf.io.FixedLenFeature([FEATURES], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
    }


def write_tfrecords(directory: str, examples: int, files: int) -> list:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    paths = []
    per_file = examples // files
    for j in range(files):
        path = os.path.join(directory, f"bench-{j:03d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            values = rng.normal(size=(per_file, FEATURES)).astype("float32")
            for i in range(per_file):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=values[i])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
                }
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
        paths.append(path)
    return paths


def parse(record):
    import tensorflow as tf

    parsed = tf.io.parse_single_example(record, feature_spec())
    return parsed["x"], parsed["y"]


def parse_batch(records):
    """The same parse, vectorized over a batch of records (tf.io.parse_example)."""
    import tensorflow as tf

    parsed = tf.io.parse_example(records, feature_spec())
    return parsed["x"], parsed["y"]


def x_and_y(features):
    """The parsed features dict of features= as the (x, y) pair the other cases yield."""
    return features["x"], features["y"]


def one_pass(dataset) -> tuple:
    """(examples, wall seconds, process CPU seconds) of one full pass over `dataset`."""
    import tensorflow as tf

    count = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for x, _ in dataset:
        count += int(tf.shape(x)[0])
    return count, time.perf_counter() - wall, time.process_time() - cpu


def compare(cases: dict, repeats: int) -> dict:
    """Median examples/s (and per CPU-second) of each case; one warm-up pass each, then the
    cases take turns pass by pass, so that all of them see the same machine load."""
    datasets = {name: make() for name, make in cases.items()}
    for dataset in datasets.values():
        one_pass(dataset)
    runs = {name: {"wall": [], "cpu": []} for name in cases}
    for _ in range(repeats):
        for name, dataset in datasets.items():
            count, wall, cpu = one_pass(dataset)
            runs[name]["wall"].append(count / wall)
            runs[name]["cpu"].append(count / cpu)
    return {
        name: {
            "median": statistics.median(r["wall"]),
            "runs": r["wall"],
            "per_cpu_second": statistics.median(r["cpu"]),
            "cpu_runs": r["cpu"],
        }
        for name, r in runs.items()
    }


def bench_input(args) -> dict:
    import numpy as np
    import tensorflow as tf

    from tfdist.data import dataset_fn_for

    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        paths = write_tfrecords(tmp, args.examples, args.files)
        context = tf.distribute.InputContext(1, 0, 1)
        autotuned = tf.data.Options()
        autotuned.autotune.enabled = True
        cases = {
            "tfrecord naive": lambda: (
                tf.data.Dataset.from_tensor_slices(paths)
                .flat_map(tf.data.TFRecordDataset)
                .map(parse)
                .batch(BATCH)
            ),
            "tfrecord tfdist": lambda: dataset_fn_for(
                tf.data.TFRecordDataset(paths), BATCH, map_fn=parse
            )(context),
            "tfrecord tfdist vectorized": lambda: dataset_fn_for(
                tf.data.TFRecordDataset(paths), BATCH, batch_map_fn=parse_batch
            )(context),
            "tfrecord tfdist autotuned": lambda: dataset_fn_for(
                tf.data.TFRecordDataset(paths).with_options(autotuned), BATCH, map_fn=parse
            )(context),
            "tfrecord tfdist features": lambda: dataset_fn_for(
                tf.data.TFRecordDataset(paths),
                BATCH,
                features=feature_spec(),
                batch_map_fn=x_and_y,
            )(context),
        }
        rng = np.random.default_rng(1)
        x = rng.normal(size=(args.examples, FEATURES)).astype("float32")
        y = rng.integers(0, 10, size=args.examples)
        results = compare(cases, args.repeats)
        results.update(
            compare(
                {
                    "arrays naive": lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
                    "arrays tfdist": lambda: dataset_fn_for((x, y), BATCH)(context),
                },
                args.repeats,
            )
        )
    return results


TRAIN_CHILD = """
import json, statistics, sys, time, warnings
import numpy as np
steps, repeats, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
import keras
from tfdist.precision import precision_scope
warnings.simplefilter("ignore")  # mixed_bfloat16 without native bf16 warns: measured here
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * batch, 784)).astype("float32")
y = rng.integers(0, 10, size=steps * batch)
models = {}
for policy in ("float32", "mixed_bfloat16"):
    keras.utils.set_random_seed(0)
    with precision_scope(policy):
        model = keras.Sequential([
            keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10), keras.layers.Activation("softmax", dtype="float32")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    models[policy] = model
results = {policy: {"wall": [], "cpu": [], "loss": None} for policy in models}
# one warm-up epoch each (tracing), then alternate the policies epoch by epoch, so that both
# see the same machine load
for attempt in range(repeats + 1):
    for policy, model in models.items():
        wall, cpu = time.perf_counter(), time.process_time()
        history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if attempt:
            results[policy]["wall"].append(steps * batch / wall)
            results[policy]["cpu"].append(steps * batch / cpu)
        results[policy]["loss"] = history.history["loss"][-1]
out = {policy: {"median": statistics.median(r["wall"]), "runs": r["wall"],
                "per_cpu_second": statistics.median(r["cpu"]), "cpu_runs": r["cpu"],
                "final_loss": r["loss"],
                "compute_dtype": models[policy].layers[0].compute_dtype}
       for policy, r in results.items()}
print("RESULT " + json.dumps(out))
"""


def bench_training(args) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN_CHILD, str(args.train_steps), str(args.repeats), str(BATCH)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"training benchmark failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# The suite's rows (benchmarks/run.py): (scenario, tfdist case, alternative case, its name).
# The last item is the target ratio (on the examples/s rows only).
ROWS = (
    (
        "input pipeline, TFRecord files, map_fn (per record)",
        "tfrecord tfdist",
        "tfrecord naive",
        "naive tf.data",
        1.0,
    ),
    (
        "input pipeline, TFRecord files, map_fn, autotuning on (dataset option)",
        "tfrecord tfdist autotuned",
        "tfrecord naive",
        "naive tf.data",
        None,
    ),
    (
        "input pipeline, TFRecord files, batch_map_fn (parse_example)",
        "tfrecord tfdist vectorized",
        "tfrecord naive",
        "naive tf.data",
        None,
    ),
    (
        "input pipeline, TFRecord files, features= (per batch)",
        "tfrecord tfdist features",
        "tfrecord naive",
        "naive tf.data",
        5.0,
    ),
    ("input pipeline, in-memory arrays", "arrays tfdist", "arrays naive", "naive tf.data", None),
)
DEFAULT = dict(repeats=7, examples=65536, files=8, train_steps=20)
QUICK = dict(repeats=3, examples=16384, files=4, train_steps=8)


def run(quick: bool = False) -> list:
    """For benchmarks/run.py: this benchmark in a child process, as rows of the suite."""
    import common

    cfg = QUICK if quick else DEFAULT
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--json",
        "--repeats",
        str(cfg["repeats"]),
        "--examples",
        str(cfg["examples"]),
        "--files",
        str(cfg["files"]),
        "--train-steps",
        str(cfg["train_steps"]),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    if proc.returncode:
        raise RuntimeError(f"bench_input failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    rows = []
    for suffix, key, unit in (("", "runs", "examples/s"), (" (CPU)", "cpu_runs", "examples/CPU-s")):
        inp, train = report["input"], report["training"]
        for scenario, ours, theirs, name, target in ROWS:
            rows.append(
                common.row(
                    scenario + suffix,
                    inp[ours][key],
                    inp[theirs][key],
                    name,
                    unit,
                    target=None if suffix else target,
                    config=cfg,
                    cpu_model=report["cpu_model"],
                )
            )
        rows.append(
            common.row(
                "training, mixed_bfloat16 (one device)" + suffix,
                train["mixed_bfloat16"][key],
                train["float32"][key],
                "float32",
                unit,
                config=cfg,
                notes=""
                if suffix
                else "auto picks mixed_bfloat16 only on CPUs with native bf16 (AMX / AVX512_BF16)",
            )
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per case")
    parser.add_argument("--examples", type=int, default=65536, help="TFRecord examples")
    parser.add_argument("--files", type=int, default=8, help="TFRecord files")
    parser.add_argument(
        "--train-steps",
        "--train_steps",
        type=int,
        default=20,
        help="training steps per timed epoch (batch 256)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)

    import common  # beside this file: on sys.path when it runs as a script

    started = time.perf_counter()
    report = {
        "input": bench_input(args),
        "training": bench_training(args),
        "cpu_count": os.cpu_count(),
        "cpu_model": common.cpu_model(),
    }
    inp, train = report["input"], report["training"]
    report["ratios"] = {
        "tfrecord tfdist / naive": inp["tfrecord tfdist"]["median"]
        / inp["tfrecord naive"]["median"],
        "tfrecord tfdist vectorized / naive": inp["tfrecord tfdist vectorized"]["median"]
        / inp["tfrecord naive"]["median"],
        "tfrecord tfdist features / naive": inp["tfrecord tfdist features"]["median"]
        / inp["tfrecord naive"]["median"],
        "tfrecord tfdist autotuned / naive": inp["tfrecord tfdist autotuned"]["median"]
        / inp["tfrecord naive"]["median"],
        "tfrecord tfdist / naive per CPU-second": inp["tfrecord tfdist"]["per_cpu_second"]
        / inp["tfrecord naive"]["per_cpu_second"],
        "tfrecord vectorized / naive per CPU-second": inp["tfrecord tfdist vectorized"][
            "per_cpu_second"
        ]
        / inp["tfrecord naive"]["per_cpu_second"],
        "tfrecord features / naive per CPU-second": inp["tfrecord tfdist features"][
            "per_cpu_second"
        ]
        / inp["tfrecord naive"]["per_cpu_second"],
        "arrays tfdist / naive per CPU-second": inp["arrays tfdist"]["per_cpu_second"]
        / inp["arrays naive"]["per_cpu_second"],
        "arrays tfdist / naive": inp["arrays tfdist"]["median"] / inp["arrays naive"]["median"],
        "mixed_bfloat16 / float32": train["mixed_bfloat16"]["median"] / train["float32"]["median"],
        "mixed_bfloat16 / float32 per CPU-second": train["mixed_bfloat16"]["per_cpu_second"]
        / train["float32"]["per_cpu_second"],
    }
    report["seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from tfdist.precision import auto_precision

    auto = auto_precision()
    print(
        f"host: {report['cpu_model']}, {os.cpu_count()} CPU(s); auto precision: "
        f"{auto['policy']} ({auto['reason']})"
    )
    print(
        f"input pipeline, examples/s (median of {args.repeats}, batch {BATCH}, "
        f"{args.examples} examples, {args.files} TFRecord files):"
    )
    for name, value in inp.items():
        print(
            f"  {name:28} {value['median']:>12,.0f}   ({value['per_cpu_second']:,.0f} per "
            "CPU-second)"
        )
    print(
        f"training, examples/s (median of {args.repeats} epochs of {args.train_steps} steps, "
        f"MLP 784-1024-1024-10, batch {BATCH}, Adam, one device, epochs alternated):"
    )
    for name, value in train.items():
        print(
            f"  {name:28} {value['median']:>12,.0f}   ({value['per_cpu_second']:,.0f} per "
            f"CPU-second; compute dtype {value['compute_dtype']}, final loss "
            f"{value['final_loss']:.3f})"
        )
    print("ratios:")
    for name, value in report["ratios"].items():
        print(f"  {name:44} {value:.2f}x")
    print(f"({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
