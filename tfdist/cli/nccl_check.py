"""The NCCL check of `tfdist doctor`: a real all-reduce between this host's GPUs through NCCL.

    python -m tfdist.cli.nccl_check                    # every GPU, NCCL
    python -m tfdist.cli.nccl_check --logical 2        # 2 logical GPUs carved from the first
    python -m tfdist.cli.nccl_check --cpus 2 --communication reduce_to_one_device   # CPU host

One process runs MirroredStrategy over the devices with the cross-device ops `communication`
names (`tfdist.strategy.mirrored_cross_device_ops`: NCCL by default), all-reduces a tensor of
each of `SIZES` in a compiled step, checks every element of every sum exactly (replica r sends
r + 1), and times the largest. It prints one line, `NCCL_CHECK {json}`: "ok", the devices, the
bus bandwidth, or the error. The doctor runs it in a process of its own with a time limit
(`run`), so that an NCCL that hangs cannot hang the doctor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import List, Optional, Sequence

__all__ = ["MARK", "SIZES", "check", "parse", "run"]

MARK = "NCCL_CHECK "
SIZES = (256, 1 << 18, 1 << 24)  # float32 elements: 1 KiB, 1 MiB, 64 MiB
_TIMED_ROUNDS = 5


def check(devices: Sequence[str], communication: str = "nccl", sizes=SIZES) -> dict:
    """All-reduces (SUM) one tensor of each size over `devices`; returns what `main` prints.

    Raises:
        AssertionError: a sum is not exact.
    """
    import numpy as np
    import tensorflow as tf

    from tfdist.strategy import mirrored_cross_device_ops

    strategy = tf.distribute.MirroredStrategy(
        devices=list(devices), cross_device_ops=mirrored_cross_device_ops(communication, devices)
    )
    replicas = strategy.num_replicas_in_sync
    expected = replicas * (replicas + 1) / 2

    def make_step(size):
        @tf.function
        def step():
            def replica_fn():
                ctx = tf.distribute.get_replica_context()
                value = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
                return ctx.all_reduce("SUM", tf.fill([size], value))

            return strategy.experimental_local_results(strategy.run(replica_fn))

        return step

    out = {"devices": list(devices), "communication": communication, "sizes": list(sizes)}
    for size in sizes:
        step = make_step(size)
        for result in step():  # the first call compiles and builds the communicators
            values = result.numpy()
            if values.shape != (size,) or not np.all(values == expected):
                wrong = values[values != expected][:3]
                raise AssertionError(
                    f"the all-reduce of {size} float32 over {replicas} replicas gave {wrong} "
                    f"where every element should be {expected}"
                )
        if size == max(sizes):
            took = []
            for _ in range(_TIMED_ROUNDS):
                started = time.perf_counter()
                for result in step():
                    result.numpy()
                took.append(time.perf_counter() - started)
            seconds = sorted(took)[len(took) // 2]
            # bus bandwidth as nccl-tests reports it: bytes * 2 (n - 1) / n per second
            moved = size * 4 * 2 * (replicas - 1) / replicas
            out["largest_seconds"] = round(seconds, 6)
            out["bus_gb_per_s"] = round(moved / seconds / 1e9, 3)
    out["outcome"] = "ok"
    return out


def _devices(args) -> List[str]:
    import tensorflow as tf

    if args.cpus:
        from tfdist.strategy import virtual_cpus

        return virtual_cpus(args.cpus)
    gpus = tf.config.list_physical_devices("GPU")
    if args.logical:
        if not gpus:
            raise RuntimeError("--logical needs a GPU, and TensorFlow sees none")
        config = tf.config.LogicalDeviceConfiguration(memory_limit=args.memory_mib)
        tf.config.set_logical_device_configuration(gpus[0], [config] * args.logical)
        return [f"/gpu:{i}" for i in range(args.logical)]
    return [f"/gpu:{i}" for i in range(len(gpus))]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.cli.nccl_check")
    parser.add_argument("--communication", default="nccl")
    parser.add_argument("--cpus", type=int, default=0, help="N logical CPUs instead of GPUs")
    parser.add_argument("--logical", type=int, default=0, help="N logical GPUs on the first GPU")
    parser.add_argument("--memory-mib", type=int, default=1024, help="each logical GPU's memory")
    args = parser.parse_args(argv)
    from tfdist.launcher.preload import die_with_parent

    die_with_parent()  # a doctor killed by `kill -9` leaves no check behind
    devices: List[str] = []
    try:
        devices = _devices(args)
        result = check(devices, args.communication)
    except Exception as err:  # noqa: BLE001 - the outcome is the report, whatever it is
        result = {
            "outcome": "failed",
            "devices": devices,
            "communication": args.communication,
            "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:500]}",
        }
    print(MARK + json.dumps(result), flush=True)
    return 0 if result["outcome"] == "ok" else 1


def parse(output: str) -> Optional[dict]:
    """The result line of a check's output, or None when it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return None


def run(arguments: Sequence[str] = (), timeout: float = 120.0, env=None) -> dict:
    """Runs the check in a process of its own, for at most `timeout` seconds; returns its
    result, with outcome "timeout" (the process is killed) or "failed" (no result line: the
    last lines of its output under "error") where it gave none."""
    environ = dict(os.environ if env is None else env)
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = [sys.executable, "-m", "tfdist.cli.nccl_check", *arguments]
    try:
        done = subprocess.run(
            command, env=environ, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {
            "outcome": "timeout",
            "error": f"no result in {timeout:g} s (the all-reduce hung; the process was killed)",
        }
    result = parse(done.stdout)
    if result is None:
        last = (done.stdout + done.stderr).strip().splitlines()[-5:]
        result = {
            "outcome": "failed",
            "error": f"exit code {done.returncode}, no result. Last lines: " + " | ".join(last),
        }
    return result


if __name__ == "__main__":
    sys.exit(main())
