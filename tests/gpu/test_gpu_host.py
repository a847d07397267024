"""The steps of the prepared GPU check (tests/gpu/gpu_check.py, `make test-gpu`) as tests: on
a host with a GPU each runs in a process of its own, bounded, as the check runs it; on CPUs
they are skipped. Their rehearsal on CPUs: tests/cluster/test_gpu_check_rehearsal.py."""

import os
import sys

import gpu_check  # tests/gpu is on sys.path (pytest's "prepend" import mode)
import pytest


@pytest.mark.requires_gpu(n=1)
@pytest.mark.parametrize("step", list(gpu_check.STEPS))
def test_gpu_step(step, tmp_path):
    env = dict(os.environ)
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # the steps are for one GPU: the first
    env.pop("TF_CONFIG", None)
    result = gpu_check.run_step(step, sys.executable, str(tmp_path), gpu_check.STEPS[step][0], env)
    assert result["outcome"] == "ok", (result, (tmp_path / f"{step}.log").read_text()[-3000:])
