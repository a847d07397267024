"""The steps of the prepared GPU check (tests/gpu/gpu_check.py, `make test-gpu`) as tests: on
a host with a GPU each runs in a process of its own, bounded, as the check runs it; on CPUs
they are skipped, and so is a step that does not apply to this GPU (it says why). Their
rehearsal on CPUs: tests/cluster/test_gpu_check_rehearsal.py."""

import os
import sys

import gpu_check  # tests/gpu is on sys.path (pytest's "prepend" import mode)
import pytest


@pytest.mark.requires_gpu(n=1)
@pytest.mark.parametrize("step", list(gpu_check.STEPS))
def test_gpu_step(step, tmp_path):
    env = gpu_check.step_environment(os.environ)  # the first GPU unless one is named
    result = gpu_check.run_step(step, sys.executable, str(tmp_path), gpu_check.STEPS[step][0], env)
    if result["outcome"] == "skipped":
        pytest.skip(f"{step}: {result['reason']}")
    assert result["outcome"] == "ok", (result, (tmp_path / f"{step}.log").read_text()[-3000:])
