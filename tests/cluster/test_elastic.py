"""An elastic multi_worker_mirrored job, end to end: `tfdist launch --workers 2:3` loses worker
slot 2 for good (it dies at every start while a file exists), goes on with 2 workers from the
last backup, grows back to 3 on SIGUSR1 (the tasks save at an agreed step on the launcher's
SIGTERM), and ends with the weights of an uninterrupted run: the global batch stays 12 through
every change of membership, so every step trains the same examples.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers.paths import SCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = str(SCRIPTS / "preempt_fit.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_STARTUP_TIMEOUT": "120"}


def _runs(out):
    path = os.path.join(out, "runs.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_three_workers_lose_one_for_good_then_grow_back(tmp_path):
    out, backup, broken = tmp_path / "out", tmp_path / "backup", tmp_path / "slot-2-broken"
    out.mkdir()
    broken.touch()
    args = [str(out), str(backup), "--batch", "12", "--save-freq", "2", "--step-sleep", "0.25"]
    env = dict(os.environ, **ENV)
    env.pop("TF_CONFIG", None)
    log = open(tmp_path / "launcher.log", "w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2:3", "--max-restarts", "0"]
        + ["--grace", "15", SCRIPT, *args, "--fail", f"worker:2={broken}"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not any(run[1] == "2" for run in _runs(out)):  # training goes on with 2
            assert launcher.poll() is None, open(tmp_path / "launcher.log").read()[-4000:]
            assert time.monotonic() < deadline, open(tmp_path / "launcher.log").read()[-4000:]
            time.sleep(0.2)
        broken.unlink()  # the slot is back
        os.kill(launcher.pid, signal.SIGUSR1)
        code = launcher.wait(timeout=400)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        log.close()
    output = open(tmp_path / "launcher.log").read()
    assert code == 0, output[-4000:]
    assert "lost for good" in output and "came back" in output
    counts = []
    for task, workers, _ in _runs(out):
        if task == "worker:0":
            counts.append(int(workers))
    assert counts == [3, 2, 3], counts  # each membership change cost one restart
    assert not any(_alive(int(pid)) for _, _, pid in _runs(out))

    baseline = tmp_path / "baseline"
    baseline.mkdir()
    subprocess.run(
        [sys.executable, SCRIPT, str(baseline), str(tmp_path / "b0"), "--batch", "12"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    want = json.load(open(baseline / "single.json"))
    assert want["iterations"] == 24
    for index in range(3):
        got = json.load(open(out / f"worker-{index}.json"))
        assert got["iterations"] == 24
        for a, b in zip(got["weights"], want["weights"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert not backup.exists()
