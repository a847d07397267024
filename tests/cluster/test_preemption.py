"""Preemption under multi_worker_mirrored, with real processes on loopback: SIGTERM to one task
at a chosen step stops every worker after the same step, the chief writes one backup, every task
exits 143, and the same command resumes at the next step and ends with the weights of an
uninterrupted run.

One 2-worker job pair (preempted, then resumed) per way of training: Keras 3's model.fit,
tfdist.fit with steps_per_epoch over repeated data and save_freq in steps, tf_keras' model.fit
with the signal to the chief, and Keras 3's model.fit with no callback that reads every step (so
tfdist runs 15 steps per call, and the stop and the resume fall on a call's boundary). The
pairs run side by side; the uninterrupted runs are single processes (the same global batch:
tfdist makes 2 workers train as one process does).
"""

import concurrent.futures
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfdist import flavour
from tfdist.cluster import ClusterSpec
from tfdist.preemption import PREEMPTED_EXIT_CODE

from helpers.paths import SCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = str(SCRIPTS / "preempt_fit.py")
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_STARTUP_TIMEOUT": "120"}

# name: (script arguments, environment, task signalled, optimizer step of the signal, steps)
RUNS = {
    "keras": ([], {}, "worker:1", 15, 36),
    "tfdist_fit_save_freq": (
        ["--api", "tfdist", "--steps-per-epoch", "10", "--save-freq", "4"],
        {},
        "worker:1",
        23,
        30,
    ),
    "tf_keras_chief": ([], {"TF_USE_LEGACY_KERAS": "1"}, "worker:0", 20, 36),
    # no callback reads every step: tfdist runs 15 steps per call (45-step epochs); the signal
    # comes from the input pipeline at its 5th batch, the claim at the first call's end
    "keras_steps_per_call": (
        ["--steps-per-epoch", "45", "--epoch-callbacks"],
        {},
        "worker:1",
        5,
        135,
    ),
}
STEPS_PER_CALL = {"keras_steps_per_call": 15}
if flavour.keras_version_tuple() < (3, 7):  # tfdist chooses steps per call from Keras 3.7 on
    del RUNS["keras_steps_per_call"]


def _start(directory, args, env, workers):
    """The tasks of a job (or one process when workers=0), each with its own TF_CONFIG."""
    spec = ClusterSpec.local(workers=workers) if workers else None
    tmp = os.path.join(directory, "tmp")  # where the tasks' temporary files go
    os.makedirs(tmp, exist_ok=True)
    procs = []
    for index in range(max(workers, 1)):
        task_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        task_env.update(QUIET, TMPDIR=tmp, **env)
        if spec is not None:
            task_env["TF_CONFIG"] = spec.to_json("worker", index)
        log = open(os.path.join(directory, f"task{index}.log"), "a")
        procs.append(
            subprocess.Popen(
                [sys.executable, SCRIPT, *args],
                env=task_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return procs


def _wait(procs, timeout=600):
    """Exit codes of the tasks; a task still running after `timeout` s is killed (None)."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:  # no task outlives its test
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return codes


def _run(directory, args, env, workers=2):
    return _wait(_start(directory, args, env, workers))


def _result(out, task):
    with open(os.path.join(out, task.replace(":", "-") + ".json")) as f:
        return json.load(f)


def _pair(root, name):
    args, env, who, step, _ = RUNS[name]
    directory = os.path.join(root, name)
    out, backup = os.path.join(directory, "out"), os.path.join(directory, "backup")
    os.makedirs(out)
    command = [out, backup, *args, "--signal", f"{who}:{step}"]
    first = _run(directory, command, env)
    state_path = os.path.join(backup, "tfdist-backup.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else None
    files = sorted(os.listdir(backup)) if os.path.isdir(backup) else []
    left = glob.glob(os.path.join(directory, "tmp", "tfdist-backup-*"))
    second = _run(directory, command, env)
    baseline = os.path.join(directory, "baseline")
    os.makedirs(baseline)
    _run(directory, [baseline, os.path.join(directory, "unused"), *args], env, workers=0)
    log = "".join(open(p).read() for p in sorted(glob.glob(os.path.join(directory, "*.log"))))
    return {
        "first": first,
        "state": state,
        "files": files,
        "temporary_left": left,
        "second": second,
        "results": [_result(out, f"worker:{i}") for i in range(2)] if second == [0, 0] else [],
        "baseline": _result(baseline, "single") if second == [0, 0] else None,
        "backup_after": os.path.exists(backup),
        "log": log,
    }


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("preemption"))
    with concurrent.futures.ThreadPoolExecutor(len(RUNS)) as pool:
        futures = {name: pool.submit(_pair, root, name) for name in RUNS}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(RUNS))
def test_sigterm_to_one_task_stops_every_worker_at_the_same_step_with_one_backup(pairs, name):
    run = pairs[name]
    assert run["first"] == [PREEMPTED_EXIT_CODE] * 2, run["log"][-3000:]
    state = run["state"]
    _, _, _, signalled_at, steps = RUNS[name]
    assert state["reason"] == "preemption"
    k = STEPS_PER_CALL.get(name, 1)
    # the claim is made at the boundary after the signal, and the stop one call later
    assert signalled_at < state["iterations"] <= signalled_at + 2 * k, state
    assert state["iterations"] % k == 0, state
    if k > 1:
        assert 0 < state["step"] < steps // 3, state  # inside an epoch: resumes mid-epoch
    steps_per_epoch = steps // 3
    assert state["epoch"] * steps_per_epoch + state["step"] == state["iterations"], state
    # the newest two checkpoints (one where the preemption's was the first save), written by
    # the chief only; the other worker's scratch copy is gone
    names = [state["checkpoint"]]
    if "previous" in state:
        names.append(state["previous"]["checkpoint"])
    assert len(names) == (2 if state["epoch"] or state["saves"] > 1 else 1), state
    assert run["files"] == sorted(
        ["tfdist-backup.json"]
        + [f"{n}{ending}" for n in names for ending in (".index", ".data-00000-of-00001")]
    )
    assert run["temporary_left"] == []
    assert "every worker stopped after" in run["log"]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_same_command_resumes_at_the_next_step_with_the_weights_of_an_uninterrupted_run(
    pairs, name
):
    run = pairs[name]
    assert run["second"] == [0, 0], run["log"][-3000:]
    steps = RUNS[name][4]
    saved = run["state"]["iterations"]
    assert f"optimizer step {saved}" in run["log"]
    baseline = run["baseline"]
    k = STEPS_PER_CALL.get(name)
    assert baseline["iterations"] == steps and baseline["trained"] == (0 if k else steps)
    for result in run["results"]:
        # each worker trained exactly the steps left: none twice, none skipped
        if k is None:
            assert result["trained"] == steps - saved
        else:  # (counted by the weights alone: no callback sees the steps)
            assert result["steps_per_call"] == [k] * (3 - run["state"]["epoch"]), result
        assert result["iterations"] == steps
        for got, want in zip(result["weights"], baseline["weights"]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert not run["backup_after"]  # deleted by the chief once training finished


def test_one_process_on_mirrored_stops_after_the_running_step_and_resumes(tmp_path):
    out, backup = str(tmp_path / "out"), str(tmp_path / "backup")
    os.makedirs(out)
    command = [out, backup, "--signal", "single:7"]
    assert _run(str(tmp_path), command, {}, workers=0) == [PREEMPTED_EXIT_CODE]
    state = json.load(open(os.path.join(backup, "tfdist-backup.json")))
    assert state["iterations"] in (7, 8) and state["workers"] == 1
    assert _run(str(tmp_path), command, {}, workers=0) == [0]
    result = _result(out, "single")
    assert result["iterations"] == 36 and result["trained"] == 36 - state["iterations"]


def test_sigterm_without_backup_ends_a_multi_worker_task_instead_of_being_swallowed(tmp_path):
    """TensorFlow's coordination service swallows SIGTERM; tfdist gives it back its meaning."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    procs = _start(
        str(tmp_path), [out, str(tmp_path / "b"), "--no-backup", "--epochs", "500"], {}, 2
    )
    try:
        started = os.path.join(out, "training")
        deadline = time.monotonic() + 180
        while not os.path.exists(started) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), open(tmp_path / "task0.log").read()
            time.sleep(0.2)
        assert os.path.exists(started)
        os.kill(procs[1].pid, signal.SIGTERM)
        assert procs[1].wait(timeout=30) == -signal.SIGTERM
        log = open(tmp_path / "task1.log").read()
        assert "received SIGTERM; exiting" in log
    finally:
        _wait(procs, timeout=1)
