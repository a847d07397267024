"""What the launcher's progress reports and stall detection cost: steps/s of `model.fit` under
multi_worker_mirrored (2 workers on loopback), each job under its own `tfdist launch`, with
them on (the defaults: TFDIST_STATUS_EVERY 30, TFDIST_STALL_TIMEOUT 300) and off (both 0).

On, every task runs tfdist's reporting thread, which reads `optimizer.iterations` and rewrites
the task's report file once a second, and the launcher reads the reports once a second; off, no
such thread runs in a task (checked: a job whose threads are not as asked is a FAILED row).

The worst case for a cost of this kind: a small model (MLP 32 -> 64 -> 64 -> 10, global batch
64, SGD, steps_per_execution=1), whose steps take milliseconds. The two jobs run at once: both
build their model and run an untimed warm-up fit (tracing), wait for each other, then take
turns, one timed fit of `steps` steps at a time while the other waits, the order alternating
every round, so every round measures both side by side. Rows: medians over rounds of worker 0's
steps/s (the workers are synchronous), and the "(CPU)" rows worker 0's steps per CPU-second of
its process (every thread, the reporting thread included: what the reports cost in work,
which the host's noise distorts far less than wall time), for Keras 3 and tf_keras; target
>= 0.98 on both.

The jobs' scripts are this file (`--side`), run by the launcher.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SIDES = ("on", "off")
OFF = {"TFDIST_STATUS_EVERY": "0", "TFDIST_STALL_TIMEOUT": "0"}
# many short rounds: the per-round ratio's median is what the noise of a 2-core host leaves
DEFAULT = dict(steps=600, rounds=30, flavours=("keras3", "tf_keras"), timeout=1200)
QUICK = dict(DEFAULT, steps=150, rounds=3, flavours=("keras3",), timeout=400)
TARGET = 0.98


def _turns(side: str, round_: int) -> int:
    """The turn index of `side` in round `round_` (two turns a round, the first alternating)."""
    first = SIDES[round_ % 2]
    return 2 * round_ + (0 if side == first else 1)


def _job(side: str, directory: str, rounds: int, steps: int) -> None:
    """One worker of one side's job, under the launcher."""
    import threading

    import numpy as np

    import tfdist

    strategy = tfdist.make_strategy()
    worker = tfdist.detect_cluster().task_index
    import tensorflow as tf

    keras = tfdist.flavour.keras()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64 * 16, 32)).astype("float32")
    y = rng.integers(0, 10, 64 * 16).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = data.cache().repeat().with_options(options)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)  # warm-up: tracing
    open(os.path.join(directory, f"ready-{side}-{worker}"), "w").close()
    common._wait_for_files(
        [os.path.join(directory, f"ready-{s}-{w}") for s in SIDES for w in (0, 1)],
        600,
        "the other job never got ready",
    )
    rates, cpu = [], []
    for round_ in range(rounds):
        turn = _turns(side, round_)
        common.wait_for_scheduled_turn(directory, turn)
        started, used = time.perf_counter(), time.process_time()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        rates.append(steps / (time.perf_counter() - started))
        cpu.append(steps / (time.process_time() - used))  # every thread of the process
        common.end_scheduled_turn(directory, turn, worker)
    reporting = any(t.name == "tfdist-progress" for t in threading.enumerate())
    with open(os.path.join(directory, f"{side}-{worker}.json"), "w") as f:
        json.dump({"rates": rates, "cpu": cpu, "reporting": reporting}, f)


def _pair(flavour: str, cfg: dict) -> dict:
    """Runs both sides' jobs at once; {side: worker 0's {"rates", "reporting"}}."""
    directory = tempfile.mkdtemp(prefix="bench-progress-")
    jobs = {}
    for side in SIDES:
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0")
        for name in OFF:
            env.pop(name, None)
        if side == "off":
            env.update(OFF)
        argv = [sys.executable, "-m", "tfdist", "launch", "--workers", "2"]
        argv += [os.path.abspath(__file__), "--", "--side", side, "--dir", directory]
        argv += ["--rounds", str(cfg["rounds"]), "--steps", str(cfg["steps"])]
        log = open(os.path.join(directory, f"{side}.log"), "w")
        jobs[side] = (subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    end = time.monotonic() + cfg["timeout"]
    try:
        for process, _ in jobs.values():
            process.wait(timeout=max(end - time.monotonic(), 1))
    finally:
        for process, log in jobs.values():
            if process.poll() is None:
                process.terminate()  # the launcher stops its tasks
                process.wait(timeout=60)
            log.close()
    results = {}
    for side, (process, _) in jobs.items():
        path = os.path.join(directory, f"{side}-0.json")
        if process.returncode != 0 or not os.path.exists(path):
            with open(os.path.join(directory, f"{side}.log")) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"the {side} job exited {process.returncode}:\n{tail}")
        with open(path) as f:
            results[side] = json.load(f)
    return results


def run(quick: bool = False) -> list:
    cfg = QUICK if quick else DEFAULT
    rows = []
    for flavour in cfg["flavours"]:
        label = "tf_keras" if flavour == "tf_keras" else "Keras 3"
        scenario = f"fit, multi_worker_mirrored 2 workers, {label}: progress and stalls on"
        try:
            results = _pair(flavour, cfg)
            if not results["on"]["reporting"] or results["off"]["reporting"]:
                raise RuntimeError(f"the tasks' reporting threads are not as asked: {results}")
        except Exception as err:  # one failed pair is a FAILED row; the other runs
            rows.append(common.error_row(scenario, str(err), "off"))
            continue
        for key, unit, suffix, target in (
            ("rates", "steps/s", "", TARGET),
            ("cpu", "steps/CPU-s", " (CPU)", TARGET),
        ):
            on, off = results["on"][key], results["off"][key]
            paired = statistics.median(a / b for a, b in zip(on, off))
            rows.append(
                common.row(
                    scenario + suffix,
                    on,
                    off,
                    "off (TFDIST_STATUS_EVERY=0, TFDIST_STALL_TIMEOUT=0)",
                    unit,
                    target=target,
                    steps_per_round=cfg["steps"],
                    round_ratio_median=paired,
                    notes=f"median of the per-round ratios: {paired:.3f}x",
                )
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=SIDES)
    parser.add_argument("--dir")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.side:
        _job(args.side, args.dir, args.rounds, args.steps)
    else:
        common.print_table(run(quick=args.quick))
