"""SLURM end to end on this machine: only the variables of a 2-task srun step are faked."""

import os
import subprocess
import sys

import pytest

from helpers.paths import EXAMPLES
from helpers.scheduler import srun_step_environment, two_consecutive_free_ports

pytestmark = pytest.mark.slow

EXAMPLE = os.path.join(EXAMPLES, "allreduce.py")


def test_two_task_srun_step_trains_without_tf_config():
    port = two_consecutive_free_ports()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(srun_step_environment(rank, port), TFDIST_STARTUP_TIMEOUT="60")
        procs.append(
            subprocess.Popen(
                [sys.executable, EXAMPLE],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, output
        assert (
            f"CollectiveAllReduceStrategy with 2 replicas: task worker:{rank} gave "
            f"{rank + 1}, all-reduced sum = 3"
        ) in output
