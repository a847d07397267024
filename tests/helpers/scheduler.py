"""SLURM and Kubernetes on this machine, for the preemption tests: a fake `srun` and `scontrol`
that the real batch script runs, the pods of a manifest as local processes, and what the
training (scripts/sched_fit.py) leaves behind.

Only what the scheduler hands a task is faked: its environment variables and its signals. The
batch script, the pods' command lines, tfdist and TensorFlow are the real ones.
"""

import json
import os
import signal
import socket
import stat
import sys
import time

from tfdist.cluster import free_ports
from tfdist.testing import is_running

from helpers.paths import ROOT, SCRIPTS

TRAINING = SCRIPTS / "sched_fit.py"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
KUBERNETES = ROOT / "examples" / "kubernetes"
SLOTS = 2  # tasks on the fake node

# srun on this machine: one node, "localhost", with SLOTS task slots.
FAKE_SRUN = '''#!{python}
"""srun for tests: runs a job step as local processes on one node, "localhost".

Gives each task the variables srun gives it (as tests/cluster/test_slurm_integration.py sets
them; the job's own, SLURM_JOB_ID and the like, come from the batch script's environment),
forwards SIGTERM and SIGINT to every task (to its process group, as slurmstepd signals every
process of a task), waits for all of them, and exits as srun does: with the highest exit code
of the tasks, a task killed by a signal counting as 128 + the signal. Options before the command
must be written --name=value; --ntasks-per-node and --ntasks set the number of tasks (at most
{slots}), other options are ignored. Each step appends a JSON line to $FAKE_SRUN_LOG.
"""
import json, os, signal, subprocess, sys

LOG = os.environ["FAKE_SRUN_LOG"]


def main():
    args = sys.argv[1:]
    ntasks = {slots}
    while args and args[0].startswith("-"):
        name, _, value = args.pop(0).partition("=")
        if name in ("--ntasks-per-node", "--ntasks"):
            ntasks = min(ntasks, int(value))
    if not args:
        sys.exit("srun: no command")
    with open(LOG, "a+") as f:
        f.seek(0)
        step = len(f.read().splitlines())
    procs, received = [], []

    def forward(signum, frame):
        received.append(signum)
        for proc in procs:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    with open(LOG + ".pids", "a") as f:  # for the test to clean up after a failure
        f.write(f"{{os.getpid()}}\\n")
    for rank in range(ntasks):
        env = dict(
            os.environ,
            SLURM_STEP_ID=str(step),
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            SLURM_STEP_NUM_TASKS=str(ntasks),
            SLURM_STEP_NUM_NODES="1",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE=str(ntasks),
        )
        procs.append(subprocess.Popen(args, env=env, start_new_session=True))
        with open(LOG + ".pids", "a") as f:
            f.write(f"{{procs[-1].pid}}\\n")
        if received:  # a signal came while the tasks were starting
            os.killpg(procs[-1].pid, received[-1])
    codes = [proc.wait() for proc in procs]
    status = max(code if code >= 0 else 128 - code for code in codes)
    with open(LOG, "a") as f:
        f.write(json.dumps({{"argv": args, "step": step, "srun_pid": os.getpid(),
                            "pids": [p.pid for p in procs],
                            "returncodes": codes, "signals": received,
                            "status": status}}) + "\\n")
    sys.exit(status)


main()
'''

# scontrol on this machine: records its arguments, one line a call.
FAKE_SCONTROL = """#!/bin/sh
echo "$*" >> "$FAKE_SCONTROL_LOG"
"""

# `python` on the PATH of the batch script and the pods: this test run's interpreter.
PYTHON_SHIM = """#!/bin/sh
exec {python} "$@"
"""


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_bin(directory):
    """Writes srun, scontrol and python into `directory`; returns it (to put first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    _executable(directory / "srun", FAKE_SRUN.format(python=sys.executable, slots=SLOTS))
    _executable(directory / "scontrol", FAKE_SCONTROL)
    _executable(directory / "python", PYTHON_SHIM.format(python=sys.executable))
    return directory


def base_env(bin_dir, **extra):
    """This process's environment without a cluster, with `bin_dir` first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "TF_CONFIG" and not k.startswith(("SLURM_", "TFDIST_", "JOB_COMPLETION"))
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        TF_CPP_MIN_LOG_LEVEL="2",
        TFDIST_STARTUP_TIMEOUT="60",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def srun_step_environment(rank, port, tasks=2):
    """The variables srun sets in task `rank` of a one-node step of `tasks` tasks (what tfdist
    reads), with TFDIST_SLURM_PORT: the step's first port."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": str(tasks),
        "TFDIST_SLURM_PORT": str(port),
    }


def free(port):
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def two_consecutive_free_ports():
    """srun's tasks on one node listen on base port + local task index."""
    while True:
        port = free_ports(1)[0]
        if port < 65535 and free(port + 1):
            return port


def wait_for(paths, procs, timeout=180.0):
    """Waits until every path exists; fails if a process in `procs` ends first."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        ended = [p.args for p in procs if p.poll() is not None]
        assert not ended, f"ended before {[str(p) for p in paths]} appeared: {ended}"
        assert time.monotonic() < deadline, f"none of {paths} appeared in {timeout} s"
        time.sleep(0.05)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def started(model_dir, tasks=("worker:0", "worker:1")):
    """The .started records of `tasks` in `model_dir` (sched_fit.py)."""
    return {t: read_json(os.path.join(model_dir, t.replace(":", "-") + ".started")) for t in tasks}


def results(model_dir, tasks=("worker:0", "worker:1")):
    """The final records of `tasks` in `model_dir` (sched_fit.py), or None for a missing one."""
    out = {}
    for task in tasks:
        path = os.path.join(model_dir, task.replace(":", "-") + ".json")
        out[task] = read_json(path) if os.path.exists(path) else None
    return out


def alive(pids):
    """The pids of `pids` that still run."""
    return [pid for pid in pids if is_running(pid)]


def kill(pids):
    """SIGKILL to every pid of `pids` that still runs (cleaning up after a failed test)."""
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def srun_pids(log):
    """Every pid the fake srun writing `log` started: its own and its tasks'."""
    path = f"{log}.pids"
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split()]
