"""SLURM preemption end to end on this machine: the real examples/slurm/train.sbatch, run by bash
as sbatch would, with fake `srun` and `scontrol` first on PATH (helpers/scheduler.py).

The fake srun starts the 2 tasks of a step on one node with the variables of a srun step (as
test_slurm_integration.py sets them), forwards SIGTERM to them and exits as srun does. The
training is scripts/sched_fit.py (TRAIN_SCRIPT): 24 steps of a small model with
tfdist.BackupAndRestore, slow enough to be interrupted.

One job, 4242, run twice, its runs shared by the tests of this module:

1. SIGTERM to the batch script once both tasks have trained a step (what `--signal=B:TERM`
   and a preemption send): the script passes it on to srun, every task saves and exits with
   143, and the script requeues the job (`scontrol requeue 4242`) and exits 0.
2. The requeued run (SLURM_RESTART_COUNT=1, the same SLURM_JOB_ID): it resumes from the backup
   at the next step, trains to the end, exits 0, and requeues nothing.

A few cheap runs check the script's other exits with a stand-in for the training.
"""

import json
import signal
import subprocess
import textwrap

import pytest

from helpers.scheduler import (
    SBATCH,
    TRAINING,
    alive,
    base_env,
    fake_bin,
    kill,
    read_json,
    results,
    srun_pids,
    started,
    two_consecutive_free_ports,
    wait_for,
)

pytestmark = pytest.mark.slow

JOB_ID = "4242"
STEPS = 24  # --epochs 2 (arguments of the batch script go to the training): 12 steps each
TIMEOUT = 240


class Job:
    """The directories of one fake SLURM job and a way to run its batch script."""

    def __init__(self, root, job_id=JOB_ID):
        self.root, self.job_id = root, job_id
        self.bin = fake_bin(root / "bin")
        self.submit = root / "submit"  # the directory sbatch was called from: $PWD of the job
        self.submit.mkdir()
        self.run_dir = self.submit / f"digits-{job_id}"  # the script's RUN_DIR
        self.backup = self.run_dir / "backup"
        self.output = root / f"tfdist-{job_id}.out"  # --output, --open-mode=append
        self.scontrol_log = root / "scontrol.log"

    def start(self, run, restart_count=0, args=("--epochs", "2"), **env):
        extra = {
            "SLURM_JOB_ID": self.job_id,
            "SLURM_JOB_NAME": "train",
            "TFDIST_SLURM_PORT": str(two_consecutive_free_ports()),
            "TRAIN_SCRIPT": str(TRAINING),
            "FAKE_SRUN_LOG": str(self.srun_log(run)),
            "FAKE_SCONTROL_LOG": str(self.scontrol_log),
        }
        if restart_count:
            extra["SLURM_RESTART_COUNT"] = str(restart_count)
        extra.update(env)
        with open(self.output, "a") as out:
            return subprocess.Popen(
                ["bash", str(SBATCH), *args],
                cwd=self.submit,
                env=base_env(self.bin, **extra),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def srun_log(self, run):
        return self.root / f"srun-{run}.log"

    def steps(self, run):
        """The srun steps of a run of the batch script, as the fake srun logged them."""
        path = self.srun_log(run)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def scontrol_calls(self):
        return self.scontrol_log.read_text().splitlines() if self.scontrol_log.exists() else []

    def tail(self):
        return self.output.read_text()[-5000:] if self.output.exists() else ""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Job 4242, preempted once, then run again as SLURM runs a requeued job."""
    job = Job(tmp_path_factory.mktemp("slurm"))
    state, batches = {}, []
    try:
        batch = job.start("first")
        batches.append(batch.pid)
        wait_for([job.run_dir / "worker-0.started", job.run_dir / "worker-1.started"], [batch])
        state["first_started"] = started(job.run_dir)
        batch.send_signal(signal.SIGTERM)  # to the batch shell only, as --signal=B:TERM does
        state["first_code"] = batch.wait(timeout=TIMEOUT)
        state_file = job.backup / "tfdist-backup.json"
        state["backup_after_first"] = read_json(state_file) if state_file.exists() else None
        state["scontrol_after_first"] = job.scontrol_calls()

        batch = job.start("requeued", restart_count=1)
        batches.append(batch.pid)
        state["second_code"] = batch.wait(timeout=TIMEOUT)
        state["second_started"] = started(job.run_dir)
        state["results"] = results(job.run_dir)
        state["batch_pids"] = batches
        yield job, state
    finally:  # after a failure, nothing of the job may run on
        kill(batches + srun_pids(job.srun_log("first")) + srun_pids(job.srun_log("requeued")))


def test_sigterm_to_the_batch_script_saves_and_requeues_the_job(job):
    job, state = job
    assert state["first_code"] == 0, job.tail()
    assert state["scontrol_after_first"] == [f"requeue {JOB_ID}"], job.tail()
    assert f"requeueing job {JOB_ID}" in job.tail()

    env_step, training = job.steps("first")
    # the environment report, once per job, in one task (--ntasks-per-node=1 on this node)
    assert env_step["argv"][-3:] == ["-m", "tfdist", "env"] and env_step["status"] == 0
    assert len(env_step["pids"]) == 1
    # the training step: the batch script passed SIGTERM on to srun, srun to both tasks, and
    # both saved and exited with tfdist.PREEMPTED_EXIT_CODE
    assert training["argv"][1] == str(TRAINING)
    assert training["signals"] == [signal.SIGTERM]
    assert training["returncodes"] == [143, 143]
    assert training["status"] == 143

    backup = state["backup_after_first"]
    assert backup is not None, job.tail()
    assert backup["reason"] == "preemption"
    assert 0 < backup["iterations"] < STEPS
    # the tasks ran in the srun step: ranks from SLURM_PROCID, the cluster from the step
    for rank, task in enumerate(("worker:0", "worker:1")):
        env = state["first_started"][task]["env"]
        assert env["SLURM_PROCID"] == str(rank) and env["SLURM_JOB_ID"] == JOB_ID
        assert "TF_CONFIG" not in env


def test_the_requeued_run_resumes_at_the_next_step_and_finishes(job):
    job, state = job
    assert state["second_code"] == 0, job.tail()
    saved = state["backup_after_first"]["iterations"]
    (training,) = job.steps("requeued")  # no environment report after a requeue
    assert training["returncodes"] == [0, 0]
    for record in state["second_started"].values():
        assert record["env"]["SLURM_RESTART_COUNT"] == "1"
        assert record["iterations"] == saved + 1  # its first step: the one after the backup
    for task, result in state["results"].items():
        assert result is not None, (task, job.tail())
        assert result["iterations"] == STEPS  # every step once, over both runs
        assert result["trained"] == STEPS - saved
    assert state["results"]["worker:0"]["weights"] == state["results"]["worker:1"]["weights"]
    assert "restored the backup" in job.tail()
    # finished: the chief deleted the backup, and nothing requeued the job again
    assert not job.backup.exists()
    assert job.scontrol_calls() == [f"requeue {JOB_ID}"]


def test_no_process_outlives_its_run(job):
    job, state = job
    pids = list(state["batch_pids"])
    for run in ("first", "requeued"):
        for step in job.steps(run):
            pids += step["pids"] + [step["srun_pid"]]
    assert not alive(pids)


# ------------------------------------------------------------------ the script's other exits
# A stand-in for the training that exits with a given code at once (no TensorFlow).
EXIT_WITH = textwrap.dedent("""
    import os, sys
    sys.exit(int(os.environ["EXIT_WITH"]))
""")


@pytest.fixture
def quick_job(tmp_path):
    job = Job(tmp_path, job_id="77")
    script = tmp_path / "exit_with.py"
    script.write_text(EXIT_WITH)
    return job, script


def _requeued_run(job, script, code, restart_count=1, **env):
    batch = job.start("run", restart_count=restart_count, TRAIN_SCRIPT=str(script),
                      EXIT_WITH=str(code), **env)  # fmt: skip
    return batch.wait(timeout=60)


def test_a_failed_training_fails_the_job_and_is_not_requeued(quick_job):
    job, script = quick_job
    assert _requeued_run(job, script, 3) == 3, job.tail()
    assert job.scontrol_calls() == []
    (training,) = job.steps("run")
    assert training["returncodes"] == [3, 3]


def test_a_finished_training_exits_0(quick_job):
    job, script = quick_job
    assert _requeued_run(job, script, 0) == 0, job.tail()
    assert job.scontrol_calls() == []


def test_preempted_again_after_max_requeues_is_not_requeued(quick_job):
    job, script = quick_job
    code = _requeued_run(job, script, 143, restart_count=2, MAX_REQUEUES="2")
    assert code == 143, job.tail()
    assert job.scontrol_calls() == []
    assert "not requeueing" in job.tail()
    assert _requeued_run(job, script, 143, restart_count=1, MAX_REQUEUES="2") == 0
    assert job.scontrol_calls() == ["requeue 77"]


def test_a_failed_requeue_exits_with_143(quick_job):
    job, script = quick_job
    failing = job.bin / "scontrol"
    failing.write_text('#!/bin/sh\necho "$*" >> "$FAKE_SCONTROL_LOG"\nexit 1\n')
    assert _requeued_run(job, script, 143) == 143, job.tail()
    assert job.scontrol_calls() == ["requeue 77"]
    assert "submit this script again" in job.tail()
