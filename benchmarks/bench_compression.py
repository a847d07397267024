"""Training throughput with gradient compression and the Gloo transport: examples/s of
`model.fit` under multi_worker_mirrored (2 processes on loopback) with tfdist's
`gradient_compression` None, "bf16" and "fp16", with `communication="gloo"` (torch.distributed's
Gloo, the extra tfdist[gloo]) without and with "bf16", and with TensorFlow's default
communication options.

Two models (synthetic data from a fixed seed, SGD, `steps_per_execution=1`; SGD's update is one
pass over the weights, where Adam's several passes over 8.4M weights and their moments would be
a share of the communication-bound step that no transport changes):

- communication-bound: MLP 1024 -> 2048 -> 2048 -> 1024 -> 10 (8.4M parameters, 34 MB of float32
  gradients a step), 8 examples per replica: the all-reduce dominates the step (at 32 a
  replica, a CPU with bfloat16 instructions computes as long as Gloo sums);
- compute-bound: MLP 256 -> 256 -> 256 -> 10 (0.13M parameters), 4096 examples per replica.

Three jobs run at once and take turns, one timed epoch (`fit(epochs=1)`) at a time, the order
rotating every round: tfdist's job (`tfdist.make_strategy("multi_worker_mirrored")`, one model
per compression, the strategy's compression switched before each model is built and traced),
the same with `communication="gloo"`, and TensorFlow's defaults (`make_strategy(...,
communication_options=tf.distribute.experimental.CommunicationOptions())`: TensorFlow's default
communication with
tfdist's Keras fixes, so that only the communication differs). An epoch is timed as a whole fit
of `steps` steps after an untimed warm-up fit (tracing); the slower process counts. Rows: medians
over rounds, with the per-round ratios' min-max.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MODELS = {
    "communication-bound": {"layers": (1024, 2048, 2048, 1024), "batch": 8, "steps": 50},
    "compute-bound": {"layers": (256, 256, 256), "batch": 4096, "steps": 100},
}
VARIANTS = ("tf default", "None", "bf16", "fp16", "gloo", "gloo bf16")
SIDES = {"tf": ("tf default",), "tfdist": ("None", "bf16", "fp16"), "gloo": ("gloo", "gloo bf16")}
DEFAULT = {"rounds": 5}
QUICK = {"rounds": 2}


def schedule(rounds: int) -> list:
    turns = []
    for r in range(rounds):
        for model in MODELS:
            k = r % len(VARIANTS)
            turns += [(r, model, v) for v in VARIANTS[k:] + VARIANTS[:k]]
    return turns


def _build(name: str, strategy):
    import keras
    import numpy as np
    import tensorflow as tf

    spec = MODELS[name]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        layers = [keras.Input((spec["layers"][0],))]
        layers += [keras.layers.Dense(units, activation="relu") for units in spec["layers"][1:]]
        model = keras.Sequential(layers + [keras.layers.Dense(10)])
        model.compile(
            optimizer=keras.optimizers.SGD(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    global_batch = spec["batch"] * strategy.num_replicas_in_sync
    rng = np.random.RandomState(0)
    x = rng.randn(global_batch * 4, spec["layers"][0]).astype("float32")
    y = rng.randint(0, 10, len(x)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    return model, data


def job(side: str, directory: str, rounds: int) -> dict:
    """In each process of one side (`SIDES`): {variant: {model: [examples/s]}}."""
    import tensorflow as tf

    import tfdist
    from tfdist.strategy.compression import compress_multi_worker

    common.keep_awake()
    if side == "tf":
        strategy = tfdist.make_strategy(
            "multi_worker_mirrored",
            communication_options=tf.distribute.experimental.CommunicationOptions(),
        )
    else:
        communication = "gloo" if side == "gloo" else "auto"
        strategy = tfdist.make_strategy("multi_worker_mirrored", communication=communication)
    me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    built, out = {}, {}
    for index, (_, name, variant) in enumerate(schedule(rounds)):
        if variant not in SIDES[side]:
            continue
        common.wait_for_scheduled_turn(directory, index, timeout=600)
        spec = MODELS[name]
        if (name, variant) not in built:
            if side != "tf":
                mode = variant.split()[-1]
                compress_multi_worker(strategy, mode if mode in ("bf16", "fp16") else None)
            model, data = _build(name, strategy)
            model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # warm-up: tracing
            built[(name, variant)] = (model, data)
        model, data = built[(name, variant)]
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=spec["steps"], epochs=1, verbose=0)
        seconds = time.perf_counter() - start
        examples = spec["steps"] * spec["batch"] * strategy.num_replicas_in_sync
        out.setdefault(variant, {}).setdefault(name, []).append(examples / seconds)
        common.end_scheduled_turn(directory, index, me)
    return out


def measure(rounds: int) -> dict:
    import concurrent.futures

    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    samples = {}
    with tempfile.TemporaryDirectory(prefix="tfdist-compression-") as directory:
        with concurrent.futures.ThreadPoolExecutor(len(SIDES)) as pool:
            futures = [
                pool.submit(
                    common.run_fresh,
                    job,
                    workers=2,
                    args=(side, directory, rounds),
                    env=env,
                    timeout=1200,
                )
                for side in SIDES
            ]
            for future in futures:
                runs = future.result()
                for variant, by_model in runs[0].items():
                    for name, values in by_model.items():
                        other = runs[1][variant][name]
                        samples.setdefault(variant, {})[name] = [
                            min(a, b) for a, b in zip(values, other)
                        ]
    return samples


def run(quick: bool) -> list:
    cfg = QUICK if quick else DEFAULT
    samples = measure(cfg["rounds"])
    rows = []
    for name in MODELS:
        tf_, none, bf16, fp16, gloo, gloo_bf16 = (samples[v][name] for v in VARIANTS)
        bound = name == "communication-bound"
        scenario = f"fit, {name}, multi_worker_mirrored 2 processes"
        rows += [
            common.row(f"{scenario}, bf16", bf16, none, "no compression", "examples/s",
                       target=1.3 if name == "communication-bound" else 0.97),
            common.row(f"{scenario}, fp16", fp16, none, "no compression", "examples/s"),
            common.row(f"{scenario}, tfdist default", none, tf_, "TF default options",
                       "examples/s", target=1.0 if bound else 0.97),
            common.row(f"{scenario}, gloo", gloo, none, "tfdist default (ring)", "examples/s",
                       target=1.5 if bound else 0.97),
            common.row(f"{scenario}, gloo bf16", gloo_bf16, gloo, "gloo", "examples/s",
                       target=1.3 if bound else 0.97),
        ]  # fmt: skip
    for r in rows:
        r["settings"] = {**cfg, "models": MODELS}
    return rows


if __name__ == "__main__":
    common.print_table(run("--quick" in sys.argv))
