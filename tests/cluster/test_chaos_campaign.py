"""A short seeded fault-injection campaign (tests/chaos/campaign.py): every fault once, each
trial a real job under `tfdist launch`, judged on its final weights (equal to an
uninterrupted run's), its optimizer step, the processes and temporary files it left, the
warning a corrupt backup gets, and its recovery time. `make chaos` runs the long campaign."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

CAMPAIGN = pathlib.Path(__file__).resolve().parents[1] / "chaos" / "campaign.py"
FAULTS = [
    "kill_worker",
    "kill_leader",
    "kill_ps",
    "preempt",
    "freeze",
    "network_cut",
    "disk_full",
    "corrupt_backup",
    "kill_launcher",
]


# Seed 11 draws every fault, both strategies and both Keras, four trials with two faults, and
# a worker killed in a tf_keras parameter_server job (whose fit applied a step twice, 1 trial
# of 100, before the fix tf_keras_parameter_server_step_applied_once).
@pytest.mark.slow
def test_every_fault_of_a_seeded_campaign_is_survived_with_nothing_lost(tmp_path):
    out = tmp_path / "chaos"
    done = subprocess.run(
        [sys.executable, str(CAMPAIGN), "--trials", "9", "--seed", "11", "--out", str(out)],
        capture_output=True, text=True, timeout=1500,
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
    )  # fmt: skip
    trials = json.loads((out / "chaos.json").read_text())
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert len(trials) == 9 and all(t["survived"] for t in trials)
    assert sorted(t["faults"][0]["kind"] for t in trials) == sorted(FAULTS)
    for trial in trials:
        for fault in trial["faults"]:
            assert fault["recovery"] is not None and fault["injected_at"] is not None, fault
    assert {t["flavour"] for t in trials} == {"keras3", "tf_keras"}
    assert {t["strategy"] for t in trials} == {"multi_worker_mirrored", "parameter_server"}
    table = (out / "chaos.md").read_text()
    assert "9 of 9 trials survived" in table
    for fault in FAULTS:
        assert f"| {fault} |" in table
