"""Preemption on parameter_server, with real processes on loopback: SIGTERM to the chief (the
coordinator) stops the scheduling of steps; the chief saves once the scheduled groups have run
and exits 143; the next chief restores that backup (optimizer.iterations exactly the saved
count) and ends at exactly epochs * steps_per_epoch steps. The worker and ps tasks keep serving
after the chief's SIGTERM, and SIGTERM ends them (it keeps its meaning there).

A pair of chiefs (preempted, then resumed) per Keras, each running
tests/helpers/scripts/preempt_ps_fit.py: Keras 3 through tfdist's own loop, with save_freq in
steps; tf_keras (TF_USE_LEGACY_KERAS=1) through its own fit, with save_freq "epoch". The
servers (2 workers and 1 ps, `python -m tfdist serve`, each its own process) are shared where
a scheduler would keep them:

    job a: servers a   Keras 3, preempted
    job b: servers b   Keras 3, resumed in a fresh job (every task new)
                       tf_keras, preempted (a new chief on servers another chief used)
                       tf_keras, resumed (only the chief restarted, as when a scheduler
                       preempts the chief's pod alone)

One after the other: the host has 2 cores.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec
from tfdist.preemption import PREEMPTED_EXIT_CODE

from helpers.paths import ROOT, SCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = str(SCRIPTS / "preempt_ps_fit.py")
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_STARTUP_TIMEOUT": "120"}
EPOCHS, STEPS, K = 3, 40, 2  # as in the script
IN_FLIGHT = 4 * 2  # groups in flight with a backup: 4 per worker (runner.IN_FLIGHT_PER_WORKER)
SERVERS = ("worker:0", "worker:1", "ps:0")

# name: (environment, save_freq, optimizer step of the SIGTERM, in epoch 2). Keras 3 saves
# every 25 groups (50 steps): its loop stops at steps 50 and 100 to save, and the SIGTERM comes
# in the stretch from 50 to 80 (15 groups, more than it keeps in flight), before the end of it
# is scheduled.
PAIRS = {
    "keras3": ({}, "25", 55),
    "tf_keras": ({"TF_USE_LEGACY_KERAS": "1"}, "epoch", 45),
}


class _Job:
    """The worker and ps tasks of a job, and the chiefs run on them one after the other."""

    def __init__(self, directory, name):
        self.directory, self.name = directory, name
        self.spec = ClusterSpec.local(workers=2, ps=1)  # and a chief: the coordinator
        self.procs = {}
        self.outlived = []  # per chief: whether every server was still serving after it
        for task_type, index in self.spec.tasks:
            if task_type != "chief":
                self._start(f"{task_type}:{index}", ["-m", "tfdist", "serve"], {})

    def _start(self, task, argv, env, tag=""):
        paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        task_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        task_env.update(QUIET, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), **env)
        task_type, _, index = task.partition(":")
        task_env["TF_CONFIG"] = self.spec.to_json(task_type, int(index))
        log = f"{self.name}{tag}-{task.replace(':', '-')}.log"
        with open(os.path.join(self.directory, log), "w") as out:
            self.procs[task + tag] = subprocess.Popen(
                [sys.executable, *argv],
                env=task_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.directory,
            )
        return self.procs[task + tag]

    def chief(self, tag, args, env) -> int:
        """Runs the script as the chief until it exits; returns its exit code."""
        code = self._start("chief:0", [SCRIPT, *args], env, tag).wait(timeout=300)
        self.outlived.append(all(self.procs[task].poll() is None for task in SERVERS))
        return code

    def stop(self) -> dict:
        """SIGTERM to each server: their exit codes, and the tasks left running (none)."""
        servers = {}
        try:
            for task in SERVERS:
                if self.procs[task].poll() is None:
                    self.procs[task].send_signal(signal.SIGTERM)
            for task in SERVERS:
                try:
                    servers[task] = self.procs[task].wait(timeout=30)
                except subprocess.TimeoutExpired:
                    servers[task] = None
        finally:
            self.kill()
        left = []
        for task, p in self.procs.items():
            try:
                os.killpg(p.pid, 0)  # anything left in the task's session
                left.append(task)
            except ProcessLookupError:
                pass
        return {"servers": servers, "outlived": self.outlived, "left": left}

    def kill(self):
        for p in self.procs.values():  # no task outlives its test
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _phase(job, name, phase):
    """Runs one chief of pair `name`; returns what it reported."""
    env, save_freq, signal_at = PAIRS[name]
    directory = os.path.join(job.directory, name)
    os.makedirs(os.path.join(directory, "out"), exist_ok=True)
    args = [os.path.join(directory, "out"), os.path.join(directory, "backup"), phase]
    args += ["--save-freq", save_freq]
    if phase == "first":
        args += ["--signal-at", str(signal_at)]
    started = time.monotonic()
    code = job.chief(f"-{name}-{phase}", args, env)
    seconds = time.monotonic() - started
    path = os.path.join(directory, "out", phase + ".json")
    result = {"exit_code": code, "seconds": seconds, "job": job.name}
    if os.path.exists(path):
        with open(path) as f:
            result.update(json.load(f))
    if phase == "first":  # the backup as the preemption left it
        backup = os.path.join(directory, "backup")
        state = os.path.join(backup, "tfdist-backup.json")
        result["state"] = json.load(open(state)) if os.path.exists(state) else None
        result["files"] = sorted(os.listdir(backup)) if os.path.isdir(backup) else []
    else:
        result["backup_left"] = os.path.exists(os.path.join(directory, "backup"))
    return result


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ps-preemption"))
    runs, stops, active = {}, {}, []
    try:
        for job_name, phases in (
            ("a", [("keras3", "first")]),
            ("b", [("keras3", "second"), ("tf_keras", "first"), ("tf_keras", "second")]),
        ):
            job = _Job(root, job_name)
            active.append(job)
            for name, phase in phases:
                runs[name, phase] = _phase(job, name, phase)
            stops[job_name] = job.stop()
    finally:
        for job in active:
            job.kill()
    logs = {os.path.basename(p): open(p).read() for p in sorted(glob.glob(f"{root}/*.log"))}
    return {
        "runs": runs,
        "stops": stops,
        "chief_logs": {n: text for n, text in logs.items() if "chief" in n},
        "log": "\n".join(f"--- {n}\n{text[-2500:]}" for n, text in logs.items()),
    }


def _chief_log(jobs, name, phase):
    return next(t for n, t in jobs["chief_logs"].items() if f"-{name}-{phase}-" in n)


@pytest.mark.parametrize("name", list(PAIRS))
def test_sigterm_to_the_chief_saves_after_the_scheduled_groups_and_exits_143(jobs, name):
    before = jobs["runs"][name, "first"]
    assert before["exit_code"] == PREEMPTED_EXIT_CODE, jobs["log"]
    state = before["state"]
    assert state["reason"] == "preemption" and state["position"] is None, state
    # the steps that ran, and nothing else: epoch, step and the optimizer's count agree
    assert state["epoch"] * STEPS + state["step"] == state["iterations"], state
    assert before["exit"] == {"how": "preempted", "epoch": state["epoch"], "step": state["step"]}
    assert before["at_exit"]["iterations"] == state["iterations"]
    # no group scheduled after the signal: only the few in flight ran after it (those
    # waiting for a worker, the one each worker runs, one more scheduled), not the rest of
    # the epoch
    signalled = before["signalled_at"]
    assert PAIRS[name][2] <= signalled <= state["iterations"] <= signalled + (IN_FLIGHT + 4) * K
    assert state["iterations"] < EPOCHS * STEPS
    assert "SIGTERM to the coordinator (chief:0)" in _chief_log(jobs, name, "first")
    # the newest two checkpoints (the data of each in one shard per device that holds
    # variables), older ones gone
    checkpoint = [f for f in before["files"] if f != "tfdist-backup.json"]
    names = [state["checkpoint"]]
    if "previous" in state:
        names.append(state["previous"]["checkpoint"])
    assert all(f"{n}.index" in checkpoint for n in names), before["files"]
    assert all(f.split(".")[0] in names for f in checkpoint), before["files"]
    if PAIRS[name][1] == "epoch":  # one save per epoch that ended, then the preemption's
        assert state["saves"] == state["epoch"] + 1, state
    else:  # one every 25 groups of K steps (the preemption's replaces one that is due)
        every = int(PAIRS[name][1]) * K
        assert state["saves"] == (state["iterations"] - 1) // every + 1, state


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_next_chief_resumes_at_the_saved_step_and_ends_at_the_exact_count(jobs, name):
    before, after = jobs["runs"][name, "first"], jobs["runs"][name, "second"]
    assert after["exit_code"] == 0, jobs["log"]
    state = before["state"]
    saved = state["iterations"]
    assert after["at_start"]["iterations"] == saved  # right after the restore
    for got, want in zip(after["at_start"]["weights"], before["at_exit"]["weights"]):
        np.testing.assert_array_equal(got, want)
    if "optimizer" in before["at_exit"]:
        assert len(after["at_start"]["optimizer"]) == len(before["at_exit"]["optimizer"])
        for got, want in zip(after["at_start"]["optimizer"], before["at_exit"]["optimizer"]):
            np.testing.assert_array_equal(got, want)
    assert f"optimizer step {saved}" in _chief_log(jobs, name, "second")
    assert after["at_exit"]["iterations"] == EPOCHS * STEPS
    assert after["exit"] == {"how": "done"}
    # the interrupted epoch ran to its end (only its remaining steps), then the next ones
    first = state["epoch"] + (1 if state["step"] >= STEPS else 0)
    assert after["epochs"] == list(range(first, EPOCHS))
    assert not after["backup_left"]  # deleted at the end of training


def test_the_loop_reads_no_group_logs_for_the_backup(jobs):
    from tfdist import flavour

    # Keras < 3.8 marks none of Callback's empty hooks as default: there History alone makes
    # the loop read every group's logs, with or without a backup
    hooks = flavour.keras_version_tuple() < (3, 8)
    for phase in ("first", "second"):
        runs = jobs["runs"]["keras3", phase]["runs"]
        assert runs and all(r == {"batch_hooks": hooks, "ahead": IN_FLIGHT} for r in runs), runs


@pytest.mark.parametrize("job", ["a", "b"])
def test_the_servers_outlive_the_chief_and_sigterm_ends_them(jobs, job):
    stop = jobs["stops"][job]
    assert stop["outlived"] and all(stop["outlived"]), jobs["log"]
    assert stop["servers"] == {task: -signal.SIGTERM for task in SERVERS}, stop
    assert stop["left"] == []
