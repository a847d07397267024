"""Kubernetes preemption on this machine: the pods of examples/kubernetes/job-multi-worker.yaml as
local processes, with the container's command line and environment as the manifest gives them.

What the Job controller and the kubelet would add is faked: JOB_COMPLETION_INDEX per pod,
WORKER_HOSTS pointing at this machine, and the eviction, which is a SIGTERM to the container's
main process. The command itself (the shell line that writes TF_CONFIG from the index, then
`exec`s the training) is the manifest's; the training (`args`) is scripts/sched_fit.py, 24
steps of a small model with tfdist.BackupAndRestore. The pods' working directory is the
repository, as /app is in the image.

One job run twice, shared by the tests of this module:

1. SIGTERM to pod 1's process once both have trained a step: every worker stops after the same
   step, the chief saves, and both pods exit with 143, which the manifest's podFailurePolicy
   ignores (the Job replaces the pods, not counted against backoffLimit) and which the TFJob's
   `restartPolicy: ExitCode` retries (128-255).
2. The replacement pods (the same command): they resume from the backup at the next step,
   train to the end and exit 0.
"""

import json
import signal
import subprocess

import pytest

from tfdist.cluster import free_ports

from helpers.paths import ROOT
from helpers.scheduler import (
    KUBERNETES,
    TRAINING,
    alive,
    base_env,
    fake_bin,
    kill,
    read_json,
    results,
    started,
    wait_for,
)

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.slow

STEPS = 24  # --epochs 2, 12 steps each
TIMEOUT = 240


def _manifest():
    with open(KUBERNETES / "job-multi-worker.yaml") as f:
        docs = list(yaml.safe_load_all(f))
    job = next(d for d in docs if d["kind"] == "Job")
    return job, job["spec"]["template"]["spec"]["containers"][0]


def _ignored_exit_codes(job):
    """The exit codes the Job's podFailurePolicy ignores (replaces the pod, uncounted)."""
    return {
        code
        for rule in job["spec"]["podFailurePolicy"]["rules"]
        if rule["action"] == "Ignore" and rule.get("onExitCodes", {}).get("operator") == "In"
        for code in rule["onExitCodes"]["values"]
    }


class Pods:
    """The Job's pods, started as local processes."""

    def __init__(self, root):
        self.job, self.container = _manifest()
        self.bin = fake_bin(root / "bin")
        self.shared = root / "shared"  # the shared volume
        self.model_dir = self.shared / "tfdist-digits"
        self.backup = self.model_dir / "backup"
        self.logs = root / "logs"
        self.logs.mkdir()
        self.args = [
            "python", str(TRAINING), "--epochs", "2",
            "--model_dir", str(self.model_dir), "--backup_dir", str(self.backup),
        ]  # fmt: skip

    def start(self, run):
        count = self.job["spec"]["completions"]
        hosts = ",".join(f"localhost:{port}" for port in free_ports(count))
        procs = []
        for index in range(count):
            env = {e["name"]: e["value"] for e in self.container.get("env", [])}
            env.update(WORKER_HOSTS=hosts, JOB_COMPLETION_INDEX=str(index))
            with open(self.logs / f"{run}-{index}.log", "w") as out:
                procs.append(
                    subprocess.Popen(
                        self.container["command"] + self.args,
                        cwd=ROOT,  # the image's workingDir, /app
                        env=base_env(self.bin, **env),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        return procs, hosts

    def tail(self):
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.logs.iterdir())
        )


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """The Job's pods: pod 1 evicted once training has started, then the replacements."""
    pods = Pods(tmp_path_factory.mktemp("kubernetes"))
    state = {"pids": []}
    try:
        procs, state["hosts"] = pods.start("first")
        state["pids"] += [p.pid for p in procs]
        wait_for([pods.model_dir / "worker-0.started", pods.model_dir / "worker-1.started"], procs)
        state["first_started"] = started(pods.model_dir)
        procs[1].send_signal(signal.SIGTERM)  # the kubelet evicts pod 1
        state["first_codes"] = [p.wait(timeout=TIMEOUT) for p in procs]
        state_file = pods.backup / "tfdist-backup.json"
        state["backup_after_first"] = read_json(state_file) if state_file.exists() else None

        procs, _ = pods.start("replaced")
        state["pids"] += [p.pid for p in procs]
        state["second_codes"] = [p.wait(timeout=TIMEOUT) for p in procs]
        state["second_started"] = started(pods.model_dir)
        state["results"] = results(pods.model_dir)
        yield pods, state
    finally:  # after a failure, no pod may run on
        kill(state["pids"])


def test_each_pod_gets_its_tf_config_from_the_job_completion_index(pods):
    pods, state = pods
    for index, task in enumerate(("worker:0", "worker:1")):
        env = state["first_started"][task]["env"]
        assert env["JOB_COMPLETION_INDEX"] == str(index)
        config = json.loads(env["TF_CONFIG"])
        assert config == {
            "cluster": {"worker": state["hosts"].split(",")},
            "task": {"type": "worker", "index": index},
        }
        # `exec`: the training is the container's main process, which the kubelet signals
        assert state["first_started"][task]["pid"] == state["pids"][index]


def test_an_evicted_pod_and_its_peer_save_and_exit_with_a_retryable_code(pods):
    pods, state = pods
    assert state["first_codes"] == [143, 143], pods.tail()
    # what both manifests restart without counting a failure
    job, _ = _manifest()
    assert set(state["first_codes"]) <= _ignored_exit_codes(job)
    assert all(128 <= code <= 255 for code in state["first_codes"])  # TFJob: ExitCode
    backup = state["backup_after_first"]
    assert backup is not None and backup["reason"] == "preemption", pods.tail()
    assert 0 < backup["iterations"] < STEPS


def test_the_replacement_pods_resume_at_the_next_step_and_finish(pods):
    pods, state = pods
    assert state["second_codes"] == [0, 0], pods.tail()
    saved = state["backup_after_first"]["iterations"]
    for record in state["second_started"].values():
        assert record["iterations"] == saved + 1
    for task, result in state["results"].items():
        assert result is not None, (task, pods.tail())
        assert result["iterations"] == STEPS
        assert result["trained"] == STEPS - saved
    assert state["results"]["worker:0"]["weights"] == state["results"]["worker:1"]["weights"]
    assert not pods.backup.exists()  # deleted by the chief at the end


def test_no_pod_process_outlives_its_run(pods):
    _, state = pods
    assert not alive(state["pids"])
