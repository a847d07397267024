"""The scheduler files of examples/ agree with tfdist's exit code for a preempted task.

examples/slurm/train.sbatch requeues on it; examples/kubernetes/job-multi-worker.yaml ignores
it in its podFailurePolicy; tfjob-multi-worker.yaml retries it with `restartPolicy: ExitCode`.
Running them: tests/cluster/test_slurm_preemption.py, test_kubernetes_preemption.py.
"""

import re
import shutil
import subprocess

import pytest

from tfdist import PREEMPTED_EXIT_CODE

from helpers.paths import EXAMPLES

SBATCH = EXAMPLES / "slurm" / "train.sbatch"
KUBERNETES = EXAMPLES / "kubernetes"


def _sbatch_options():
    """The #SBATCH options, read as sbatch does: up to the first command of the script."""
    options = []
    for line in SBATCH.read_text().splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            options.append(stripped.split(None, 1)[1].split("#")[0].strip())
        elif stripped and not stripped.startswith("#"):
            break
    return options


BATCH_SCRIPTS = sorted((EXAMPLES / "slurm").glob("*.sbatch"))


@pytest.mark.parametrize("script", BATCH_SCRIPTS, ids=lambda p: p.name)
def test_each_batch_script_is_valid_bash(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("script", BATCH_SCRIPTS, ids=lambda p: p.name)
def test_each_batch_script_passes_shellcheck(script):
    proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_multi_node_batch_script_runs_one_launcher_per_node_with_the_allocations_ranks():
    """`tfdist launch` takes --nodes and --node-rank from SLURM_NNODES and SLURM_NODEID
    (tests/cluster/test_multi_node.py runs such a job), so the script gives neither."""
    text = (EXAMPLES / "slurm" / "launch-nodes.sbatch").read_text()
    assert "srun --ntasks-per-node=1 tfdist launch" in text
    command = text.split("srun --ntasks-per-node=1", 1)[1]
    assert "--node-rank" not in command and "--nodes" not in command
    assert "export TFDIST_RENDEZVOUS_TOKEN" in text


def test_the_batch_script_may_be_requeued_and_is_signalled_before_its_time_limit():
    options = _sbatch_options()
    assert "--requeue" in options
    assert "--open-mode=append" in options  # a requeued run appends to the same log
    signals = [o for o in options if o.startswith("--signal=")]
    assert len(signals) == 1
    match = re.fullmatch(r"--signal=B:TERM@(\d+)", signals[0])
    assert match and int(match.group(1)) >= 60, signals
    # the requeue happens on tfdist's exit code, and the signal is passed on to srun
    text = SBATCH.read_text()
    assert f"PREEMPTED={PREEMPTED_EXIT_CODE} " in text
    assert "trap on_term TERM" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    # the backup survives a requeue: keyed by the job id, which a requeue keeps
    assert "RUN_DIR=${RUN_DIR:-$PWD/digits-$SLURM_JOB_ID}" in text
    assert '--backup_dir "$RUN_DIR/backup"' in text


def _yaml_documents(name):
    yaml = pytest.importorskip("yaml")
    with open(KUBERNETES / name) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def _mounted(container, path):
    return any(
        path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        for m in container.get("volumeMounts", [])
    )


def _flag(args, name):
    return args[args.index(name) + 1]


def test_the_indexed_job_ignores_the_preempted_exit_code_and_counts_the_others():
    docs = _yaml_documents("job-multi-worker.yaml")
    service = next(d for d in docs if d["kind"] == "Service")
    job = next(d for d in docs if d["kind"] == "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    container = pod["containers"][0]

    rules = spec["podFailurePolicy"]["rules"]
    on_codes = [r for r in rules if "onExitCodes" in r]
    assert len(on_codes) == 1  # any other exit code: the default action, Count
    assert on_codes[0]["action"] == "Ignore"
    assert on_codes[0]["onExitCodes"] == {
        "containerName": container["name"],
        "operator": "In",
        "values": [PREEMPTED_EXIT_CODE],
    }
    disruption = [r for r in rules if "onPodConditions" in r]
    assert [r["action"] for r in disruption] == ["Ignore"]
    assert disruption[0]["onPodConditions"] == [{"type": "DisruptionTarget"}]
    assert pod["restartPolicy"] == "Never"  # required by podFailurePolicy
    assert spec["backoffLimit"] >= 1
    assert pod["terminationGracePeriodSeconds"] >= 60  # time to save

    # one pod per worker, all at once, each with a stable DNS name from the headless Service
    hosts = next(e["value"] for e in container["env"] if e["name"] == "WORKER_HOSTS").split(",")
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == len(hosts)
    name = job["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": name}
    assert pod["subdomain"] == service["metadata"]["name"]
    port = container["ports"][0]["containerPort"]
    assert hosts == [f"{name}-{i}.{pod['subdomain']}:{port}" for i in range(len(hosts))]
    assert "JOB_COMPLETION_INDEX" in " ".join(container["command"])
    assert 'exec "$@"' in container["command"][2]  # the training gets the kubelet's SIGTERM

    # the backup on the volume every pod mounts
    assert _mounted(container, _flag(container["args"], "--backup_dir"))


def test_the_multi_worker_tfjob_retries_the_preempted_exit_code():
    (tfjob,) = _yaml_documents("tfjob-multi-worker.yaml")
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Worker"}  # multi_worker_mirrored: no PS
    worker = replicas["Worker"]
    # the training operator retries exit codes 128-255 and fails the job on 1-127
    assert worker["restartPolicy"] == "ExitCode"
    assert 128 <= PREEMPTED_EXIT_CODE <= 255
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "tensorflow"
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert _mounted(container, _flag(container["args"], "--backup_dir"))


def test_the_parameter_server_tfjob_still_restarts_on_failure():
    (tfjob,) = _yaml_documents("tfjob.yaml")
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Chief", "Worker", "PS"}
    assert {r["restartPolicy"] for r in replicas.values()} == {"OnFailure"}
