"""tfdist doctor, run for real: a 2-process smoke test on loopback."""

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_doctor_runs_a_real_smoke_test_and_flags_tf_config_in_the_shell():
    env = dict(
        os.environ,
        TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, '
        '"task": {"type": "worker", "index": 0}}',
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
    assert "verdict: problems found" in proc.stdout
