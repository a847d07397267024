"""tfdist doctor, run for real: a 2-process smoke test on loopback, and its NCCL check's
program (`tfdist.cli.nccl_check`) on this host's CPUs."""

import os
import subprocess
import sys

import pytest

from tfdist.cli import nccl_check


@pytest.mark.slow
def test_doctor_runs_a_real_smoke_test_and_flags_tf_config_in_the_shell():
    env = dict(
        os.environ,
        TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, '
        '"task": {"type": "worker", "index": 0}}',
        TFDIST_GPUS="2",  # the smoke job's workers get a GPU each, as on a 2-GPU host
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist", "doctor", "--timeout", "150"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PROBLEM  TF_CONFIG is set in this shell" in proc.stdout
    assert "OK       2 workers met, all-reduced 1 + 2 = 3 and trained 3 steps" in proc.stdout
    for scenario in ("fit_on_a_dataset", "steps_per_execution", "checkpoints_and_backup"):
        assert f"ok       scenario {scenario}" in proc.stdout
    assert "skipped  NCCL all-reduce: it needs 2 GPUs, and TensorFlow sees 0" in proc.stdout
    assert "verdict: problems found" in proc.stdout


def test_the_nccl_check_program_all_reduces_exactly_and_reports_any_failure():
    # the same program and step as on GPUs, with CPU replicas and a reduction that runs there
    ok = nccl_check.run(["--cpus", "3", "--communication", "reduce_to_one_device"], timeout=120)
    assert ok["outcome"] == "ok", ok
    assert ok["devices"] == ["/cpu:0", "/cpu:1", "/cpu:2"] and ok["bus_gb_per_s"] > 0
    refused = nccl_check.run(["--cpus", "2"], timeout=120)  # NCCL on CPUs: tfdist's refusal
    assert refused["outcome"] == "failed"
    assert "communication='nccl' needs every replica on a GPU" in refused["error"]
    no_gpu = nccl_check.run(["--logical", "2"], timeout=120)
    assert no_gpu == {
        "outcome": "failed",
        "devices": [],
        "communication": "nccl",
        "error": "RuntimeError: --logical needs a GPU, and TensorFlow sees none",
    }
    hung = nccl_check.run(["--cpus", "2"], timeout=0.5)  # killed long before TensorFlow loads
    assert hung["outcome"] == "timeout" and "no result in 0.5 s" in hung["error"]
