"""The real `tfdist` console script (and `python -m tfdist`), as subprocesses.

`tf-config` does not import TensorFlow, so its subprocess tests are cheap. `tfdist env` does;
its two reports (with and without TF_CONFIG) run concurrently, once per module.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfdist.cluster import ClusterSpec

from helpers.cli import SPEC, _parse_export

TIMEOUT = 120


def _tfdist_command():
    """The installed console script next to this interpreter (else on PATH)."""
    path = shutil.which("tfdist", path=os.path.dirname(sys.executable)) or shutil.which("tfdist")
    if path is None:
        pytest.skip("the `tfdist` console script is not installed")
    return [path]


LAUNCHERS = {
    "console-script": _tfdist_command,
    "python-m": lambda: [sys.executable, "-m", "tfdist"],
}


def _child_env(**extra):
    """os.environ without any cluster description, TF logs quiet, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES")
        and not k.startswith(("SLURM_", "TFDIST_"))
    }
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def _run(launcher, args, **env):
    return subprocess.run(
        LAUNCHERS[launcher]() + list(args),
        env=_child_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


# ------------------------------------------------------------ tf-config, real processes


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_tf_config_all_export_subprocess(launcher):
    result = _run(
        launcher,
        [
            "tf-config",
            "--worker",
            "h1:2222,h2:2222",
            "--chief",
            "h0:2222",
            "--ps",
            "h3:2222",
            "--all",
            "--format",
            "export",
        ],
    )
    assert result.returncode == 0, result.stderr
    entries = _parse_export(result.stdout)
    tasks = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert entries == [(f"{t}:{i}", SPEC.to_tf_config(t, i)) for t, i in tasks]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_tf_config_task_json_subprocess(launcher):
    result = _run(
        launcher,
        [
            "tf-config",
            "--chief",
            "h0:2222",
            "--worker",
            "h1:2222,h2:2222",
            "--ps",
            "h3:2222",
            "--task",
            "worker:1",
        ],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    config = json.loads(result.stdout)
    assert config == SPEC.to_tf_config("worker", 1)
    assert ClusterSpec.from_tf_config(result.stdout.strip()) == SPEC.replace_task("worker", 1)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_tf_config_error_subprocess(launcher):
    result = _run(launcher, ["tf-config", "--worker", "h1:2222,h2", "--all"])
    assert result.returncode == 2
    assert result.stdout == ""
    assert "tfdist tf-config: error:" in result.stderr
    assert "'h2' is not a 'host:port' address" in result.stderr
    assert "Traceback" not in result.stderr


def test_exported_tf_config_survives_a_shell():
    """The export lines are valid shell: sourcing one gives back the exact JSON."""
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no POSIX shell")
    result = _run(
        "console-script",
        [
            "tf-config",
            "--worker",
            "h1:2222,h2:2222",
            "--chief",
            "h0:2222",
            "--ps",
            "h3:2222",
            "--task",
            "ps:0",
            "--format",
            "export",
        ],
    )
    assert result.returncode == 0, result.stderr
    shell = subprocess.run(
        [sh, "-c", result.stdout + 'printf "%s" "$TF_CONFIG"'],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert shell.returncode == 0, shell.stderr
    assert json.loads(shell.stdout) == SPEC.to_tf_config("ps", 0)


# -------------------------------------------------------------------- env, real processes

ENV_SPEC = ClusterSpec.from_hosts(workers=["127.0.0.1:23456", "127.0.0.1:23457"], task_index=1)


# A stand-in for nvidia-smi on a host whose driver lists 2 GPUs that TensorFlow cannot use.
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*) printf '%s\n' '0, NVIDIA A100-SXM4-40GB, 40960, 8.0' \
                        '1, NVIDIA A100-SXM4-40GB, 40960, 8.0' ;;
  *) printf '0\n1\n' ;;
esac
"""


@pytest.fixture(scope="module")
def env_reports(tmp_path_factory):
    """`tfdist env --json` with a 2-worker TF_CONFIG, with no cluster, and with a driver that
    lists 2 GPUs (a stand-in nvidia-smi), run concurrently."""
    command = _tfdist_command() + ["env", "--json"]
    tools = tmp_path_factory.mktemp("tools")
    (tools / "nvidia-smi").write_text(NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    path = os.pathsep.join([str(tools), os.environ.get("PATH", "")])
    envs = {
        "tf_config": _child_env(TF_CONFIG=ENV_SPEC.to_json()),
        "none": _child_env(),
        "driver_gpus": _child_env(PATH=path),
    }
    procs = {
        name: subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, env in envs.items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=TIMEOUT)
            results[name] = (proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _report(env_reports, name):
    code, out, err = env_reports[name]
    assert code == 0, err
    return json.loads(out)


def test_env_json_with_tf_config(env_reports):
    import tensorflow as tf

    report = _report(env_reports, "tf_config")
    assert report["tensorflow"] == tf.__version__
    assert report["keras_flavour"] == "keras3"
    assert report["cluster"]["detected_from"] == "tf_config"
    assert report["cluster"]["task"] == "worker:1"
    assert report["cluster"]["jobs"] == ENV_SPEC.cluster
    assert report["cluster"]["num_workers"] == 2
    assert report["cluster"]["is_chief"] is False
    assert report["auto_strategy"] == "multi_worker_mirrored"
    assert report["environment_variables"]["TF_CONFIG"] == ENV_SPEC.to_json()


def test_env_json_without_cluster(env_reports):
    report = _report(env_reports, "none")
    assert report["cluster"]["detected_from"] == "local"
    assert report["cluster"]["task"] is None
    assert report["cluster"]["jobs"] == {}
    assert report["cluster"]["is_chief"] is True
    assert report["auto_strategy"] in ("one_device", "mirrored")
    assert "TF_CONFIG" not in report["environment_variables"]
    expected = "mirrored" if len(report["replica_devices"]) > 1 else "one_device"
    assert report["auto_strategy"] == expected


def test_env_shows_the_gpus_the_driver_lists_and_why_tensorflow_sees_none(env_reports):
    import tensorflow as tf

    gpus = _report(env_reports, "driver_gpus")["gpus"]
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": "8.0"}
    assert gpus["driver_lists"] == [dict(a100, index=0), dict(a100, index=1)]
    assert gpus["tensorflow_sees"] == []  # this host has no GPU
    build = tf.sysconfig.get_build_info()
    assert gpus["cuda_build"] is bool(build.get("is_cuda_build"))
    assert gpus["cuda_version"] == build.get("cuda_version")
    assert gpus["problem"].startswith("TensorFlow sees none of the 2 GPU(s) the driver lists")
    assert "HINT:" in gpus["problem"]
    assert "problem" not in _report(env_reports, "none")["gpus"]  # no driver, no problem


def test_env_prints_one_line_per_gpu_fact(capsys):
    from tfdist.cli.environment import _print_gpus

    _print_gpus(
        {
            "gpus": {
                "driver_lists": [
                    {
                        "index": 0,
                        "name": "Tesla V100",
                        "memory_mib": None,
                        "compute_capability": None,
                    }
                ],
                "tensorflow_sees": [
                    {
                        "device": "/physical_device:GPU:0",
                        "name": "Tesla V100",
                        "compute_capability": "7.0",
                    }
                ],
                "cuda_build": True,
                "cuda_version": "12.5.1",
                "cudnn_version": "9",
            }
        }
    )
    assert capsys.readouterr().out.splitlines() == [
        "gpus             0 Tesla V100 (compute capability ?, ? MiB)",
        "tensorflow gpus  /physical_device:GPU:0 Tesla V100 (7.0)",
        "built with       CUDA 12.5.1, cuDNN 9",
    ]


def test_env_reports_the_release_status_and_every_fix(env_reports):
    import tensorflow as tf

    from tfdist import fixes, releases

    report = _report(env_reports, "none")["releases"]
    expected = releases.support(tf.__version__, report_keras(env_reports), "keras3")
    assert (report["support"], report["message"]) == (expected.status, expected.message)
    assert [r["tensorflow"] for r in report["matrix"]] == [r.tensorflow for r in releases.MATRIX]
    states = {f["name"]: f["state"] for f in report["fixes"]}
    assert set(fixes.FIXES) <= set(states)  # and the TensorFlow internals tfdist reads
    assert states["coordination_config_pb2"] == "found"
    made_by_strategies = {name: state for name, state in states.items() if name in fixes.FIXES}
    assert set(made_by_strategies.values()) <= {"applies", "not needed", "skipped", "off"}
    # keras.distribution's records are applied when Keras 3 is imported after tfdist
    from tfdist import flavour
    from tfdist.keras_distribution.records import RECORDS

    if not flavour.uses_legacy_keras():
        assert {states[r.name] for r in RECORDS} == {"applied"}


def report_keras(env_reports):
    return _report(env_reports, "none")["keras"]
