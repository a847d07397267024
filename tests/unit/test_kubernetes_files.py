"""The Kubernetes files of examples/kubernetes/, checked without a container tool or a cluster:
the manifests run the image the Dockerfiles build (one tag), the Dockerfiles install tfdist as
the README says (its wheel, with the examples extra), and the JobSet's command gives every pod
the TF_CONFIG of its own task. No test builds the image. The Indexed Job's preemption rules:
test_scheduler_files.py; its command run as local processes: tests/cluster/
test_kubernetes_preemption.py.
"""

import json
import os
import re
import subprocess
import sys

import pytest

import tfdist

from helpers.paths import EXAMPLES, ROOT

KUBERNETES = EXAMPLES / "kubernetes"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
DOCKERFILES = {"cpu": KUBERNETES / "Dockerfile", "gpu": KUBERNETES / "Dockerfile.gpu"}
REGISTRY = "registry.example.com"  # the registry the manifests name, for the user to replace


def _built_tag(dockerfile):
    """The tag the Dockerfile's header says to build it with (`docker build ... -t TAG .`)."""
    (tag,) = re.findall(r"^#\s+docker build -f \S+ -t (\S+) \.$", dockerfile.read_text(), re.M)
    return tag


def _instructions(dockerfile):
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_the_images_are_tagged_with_tfdists_version():
    assert _built_tag(DOCKERFILES["cpu"]) == f"tfdist-digits:{tfdist.__version__}"
    assert _built_tag(DOCKERFILES["gpu"]) == f"tfdist-digits:{tfdist.__version__}-gpu"


def test_every_manifest_runs_the_image_the_dockerfile_builds():
    """Read line by line (no YAML library needed): every `image:` of every manifest."""
    expected = f"{REGISTRY}/{_built_tag(DOCKERFILES['cpu'])}"
    assert {m.name for m in MANIFESTS} >= {
        "job-multi-worker.yaml",
        "jobset-parameter-server.yaml",
        "tfjob.yaml",
        "tfjob-multi-worker.yaml",
    }
    for manifest in MANIFESTS:
        images = re.findall(r"^\s*image:\s*(\S+)\s*$", manifest.read_text(), re.M)
        assert images and set(images) == {expected}, (manifest.name, images)
        # the push lines of the Dockerfile name the same image
        assert f"docker push {expected}" in DOCKERFILES["cpu"].read_text()


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_the_dockerfile_installs_the_wheel_as_the_readme_says(flavour):
    steps = _instructions(DOCKERFILES[flavour])
    # a first stage builds the wheel from the checkout, as the README does: pip wheel --no-deps
    readme = (ROOT / "README.md").read_text()
    assert "pip wheel --no-deps -w dist ." in readme
    wheel = f"tfdist-{tfdist.__version__}-py3-none-any.whl"
    assert f"pip install dist/{wheel}" in readme
    assert "COPY . /src" in steps
    builds = [s for s in steps if s.startswith("RUN pip wheel")]
    assert len(builds) == 1 and "--no-deps" in builds[0].split() and builds[0].endswith(" /src")
    # the image installs that wheel with the examples extra (the examples need scikit-learn)
    installs = [s for s in steps if s.startswith("RUN pip install")]
    assert len(installs) == 1
    assert '"$(ls /tmp/dist/tfdist-*-py3-none-any.whl)[examples]"' in installs[0]
    assert ("tensorflow[and-cuda]" in installs[0]) == (flavour == "gpu")
    # examples/ in /app, the manifests' workingDir
    assert "WORKDIR /app" in steps and "COPY examples/ /app/examples/" in steps
    for manifest in MANIFESTS:
        assert set(re.findall(r"workingDir:\s*(\S+)", manifest.read_text())) == {"/app"}


def test_the_build_context_leaves_out_the_virtualenvs_and_builds():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git/", ".venv/", ".nox/", "build/", "dist/"} <= set(ignored)


def test_every_manifest_parses():
    yaml = pytest.importorskip("yaml")
    for manifest in MANIFESTS:
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        assert docs and all("apiVersion" in d and "kind" in d for d in docs), manifest.name


def _jobset():
    yaml = pytest.importorskip("yaml")
    (jobset,) = yaml.safe_load_all((KUBERNETES / "jobset-parameter-server.yaml").read_text())
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    return jobset


def _env(container):
    return {e["name"]: e.get("value") for e in container["env"]}


def _tf_config(command, env):
    """Runs the container's command as the pod would, with the training replaced by a
    print of TF_CONFIG; `python` is this interpreter's."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    proc = subprocess.run(
        [*command, sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"],
        env={**os.environ, **env, "PATH": path},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_jobset_gives_every_pod_the_tf_config_of_its_own_task():
    jobset = _jobset()
    name, spec = jobset["metadata"]["name"], jobset["spec"]
    assert spec["network"]["enableDNSHostnames"] is True
    subdomain = spec["network"].get("subdomain", name)  # the JobSet's default
    roles = {r["name"]: r for r in spec["replicatedJobs"]}
    assert set(roles) == {"chief", "worker", "ps"}
    pods = {role: r["template"]["spec"]["template"] for role, r in roles.items()}
    assert pods["chief"] == pods["worker"] == pods["ps"]  # one pod, one command, every role
    container = pods["chief"]["spec"]["containers"][0]
    port = container["ports"][0]["containerPort"]
    role_label = container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"]
    assert role_label == "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"
    env = _env(container)
    hosts = {
        "chief": [env["CHIEF_HOST"]],
        "worker": env["WORKER_HOSTS"].split(","),
        "ps": env["PS_HOSTS"].split(","),
    }
    for role, replicated in roles.items():
        job = replicated["template"]["spec"]
        assert replicated["replicas"] == 1 and job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == len(hosts[role])
        for index in range(job["completions"]):
            # the DNS name the JobSet gives the pod: <jobset>-<replicatedJob>-<job>-<pod>
            own = f"{name}-{role}-0-{index}.{subdomain}:{port}"
            assert hosts[role][index] == own
            pod_env = {"TASK_TYPE": role, "JOB_COMPLETION_INDEX": str(index)}
            pod_env.update({k: v for k, v in env.items() if v is not None})
            tf_config = _tf_config(container["command"], pod_env)
            assert tf_config == {
                "cluster": hosts,
                "task": {"type": role, "index": index},
            }


def test_the_jobset_ends_with_the_chief_and_restarts_preempted_pods_uncounted():
    spec = _jobset()["spec"]
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    failure = spec["failurePolicy"]
    assert failure["maxRestarts"] >= 1
    assert [(r["action"], r["onJobFailureReasons"]) for r in failure["rules"]] == [
        ("RestartJobSetAndIgnoreMaxRestarts", ["PodFailurePolicy"])
    ]
    for replicated in spec["replicatedJobs"]:
        job = replicated["template"]["spec"]
        assert job["backoffLimit"] == 0  # a failed pod fails its Job: the JobSet restarts all
        rules = job["podFailurePolicy"]["rules"]
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 60
        container = pod["containers"][0]
        assert rules[0] == {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": container["name"],
                "operator": "In",
                "values": [tfdist.PREEMPTED_EXIT_CODE],
            },
        }
        assert rules[1] == {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}
        # the backup on the volume every pod mounts, the training in the shell's place
        args = container["args"]
        backup = args[args.index("--backup_dir") + 1]
        assert any(backup.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])
        assert container["command"][2].endswith('exec "$@"')
