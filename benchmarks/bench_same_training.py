"""How long `tfdist.testing.assert_same_training` takes for a small model.

The digits classifier of examples/testing/digits_same_training.py (64 -> 64 BatchNormalization
-> 10, 2 epochs of 4 steps of 63 examples) compared under one_device, mirrored (2 virtual CPUs),
multi_worker_mirrored (2 processes) and parameter_server (1 worker, 1 ps), in seconds:

- cold: the first comparison of a test process, which starts the strategies' processes (all at
  once) and then trains;
- warm: a later comparison in the same process, on the processes already running (what every
  further test of a suite pays).

The ratio is warm / cold (lower is better): what sharing the processes saves. The calling
process imports no TensorFlow; the strategies' processes do. Each repeat is a fresh set of
processes (`close_pools` between repeats).
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "testing")


def run(quick: bool = False) -> list:
    from tfdist.testing import close_pools, compare_training
    from tfdist.testing.verify import load_script

    script = load_script(os.path.join(EXAMPLE, "digits_same_training.py"))
    data = script.data()
    cold, warm = [], []
    for _ in range(1 if quick else 3):
        close_pools()
        for samples in (cold, warm):
            started = time.perf_counter()
            result = compare_training(
                script.build_model, data, global_batch_size=script.GLOBAL_BATCH_SIZE
            )
            samples.append(time.perf_counter() - started)
            if not result.same:
                raise AssertionError(result.report())
    close_pools()
    return [
        common.row(
            "assert_same_training, digits MLP, 4 strategies, 8 steps (warm vs cold)",
            warm,
            cold,
            "the first call (starts the processes)",
            "s",
            higher_is_better=False,
            notes="cold includes starting 4 TensorFlow processes at once on this machine",
        )
    ]


if __name__ == "__main__":
    common.print_table(run(quick="--quick" in sys.argv))
