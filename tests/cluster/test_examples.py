"""The examples run, with small settings, so they cannot rot (all of them at once).

One run per script: mirrored.py and mixed_precision.py as plain processes, multi_worker.py,
parameter_server.py and train.py as local jobs started by tfdist's launcher. Each test then
reads what its script printed (and wrote).
"""

import concurrent.futures
import glob
import io
import os
import re
import subprocess
import sys
import tempfile

import pytest

from tfdist.launcher import launch

from helpers.paths import EXAMPLES

pytestmark = pytest.mark.slow

ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
TIMEOUT = 600


def _process(script, args):
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script)] + args,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=dict(os.environ, **ENV),
    )
    return proc.returncode, proc.stdout + proc.stderr


def _job(script, args, **tasks):
    out = io.StringIO()
    codes = launch(
        os.path.join(EXAMPLES, script), args, out=out, timeout=TIMEOUT, extra_env=ENV, **tasks
    )
    return (0 if all(c == 0 for c in codes.values()) else 1), out.getvalue()


def _worker_temp_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tfdist-worker*")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    multi_worker_dir = tmp_path_factory.mktemp("multi_worker")
    train_dir = tmp_path_factory.mktemp("train")
    jobs = {
        # 63 = 32 + 31 per replica: every step's batch splits unevenly over the 2 replicas
        "mirrored": (
            _process,
            "mirrored.py",
            ["--virtual_cpus", "2", "--epochs", "2", "--global_batch_size", "63"],
            {},
        ),
        "multi_worker": (
            _job,
            "multi_worker.py",
            ["--epochs", "2", "--model_dir", str(multi_worker_dir)],
            {"workers": 2},
        ),
        "parameter_server": (
            _job,
            "parameter_server.py",
            ["--epochs", "2"],
            {"workers": 2, "ps": 2},
        ),
        "mixed_precision": (
            _process,
            "mixed_precision.py",
            ["--precision", "mixed_bfloat16", "--virtual_cpus", "2", "--epochs", "2"],
            {},
        ),
        "train": (
            _job,
            "train.py",
            # as examples/slurm/train.sbatch and the Kubernetes manifests run it
            ["--epochs", "2", "--model_dir", str(train_dir), "--backup_dir", str(train_dir / "b")],
            {"workers": 2},
        ),
    }
    temp_dirs_before = _worker_temp_dirs()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            name: pool.submit(fn, script, args, **tasks)
            for name, (fn, script, args, tasks) in jobs.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    results["dirs"] = {
        "multi_worker": multi_worker_dir,
        "train": train_dir,
        "worker_temp_dirs_left": _worker_temp_dirs() - temp_dirs_before,
    }
    return results


def _succeeded(runs, name, strategy):
    """The output of a run that exited 0 and printed one held-out accuracy well above chance."""
    code, output = runs[name]
    assert code == 0, output[-3000:]
    found = re.findall(rf"{strategy}: held-out accuracy ([0-9.]+) \(chance 0.100\)", output)
    assert len(found) == 1, output[-3000:]  # printed once: by the chief only, in a job
    assert float(found[0]) > 0.6, output[-3000:]  # chance is 0.1; 2 short epochs suffice
    return output


def test_mirrored_trains_with_keras_fit_on_two_replicas(runs):
    output = _succeeded(runs, "mirrored", "MirroredStrategy")
    assert "MirroredStrategy: 2 replicas on" in output
    # fit(x, y, validation_split=0.1) ran its validation every epoch
    assert len(re.findall(r"val_accuracy: [0-9.]+", output)) == 2, output
    validation = re.search(r"validation accuracy \(last epoch\) ([0-9.]+)", output)
    assert validation and float(validation.group(1)) > 0.6, output
    assert re.search(r"first 10 held-out digits: \[[0-9, ]+\], predicted \[[0-9, ]+\]", output)


def test_multi_worker_writes_checkpoints_once_and_prints_on_the_chief(runs):
    output = _succeeded(runs, "multi_worker", "CollectiveAllReduceStrategy")
    assert "[worker:0] CollectiveAllReduceStrategy: held-out accuracy" in output
    assert "[worker:0] CollectiveAllReduceStrategy: 2 replicas in sync" in output
    assert "[worker:0] Epoch 2/2" in output and "[worker:1] Epoch" not in output
    # one file per epoch, written once, by the chief; the backup is gone at the end, and so
    # are the other worker's temporary copies
    directory = runs["dirs"]["multi_worker"]
    assert sorted(os.listdir(directory)) == ["epoch01.weights.h5", "epoch02.weights.h5"]
    assert not runs["dirs"]["worker_temp_dirs_left"]


def test_parameter_server_shards_the_table_over_both_ps_tasks(runs):
    output = _succeeded(runs, "parameter_server", "ParameterServerStrategyV2")
    assert "[chief:0] ParameterServerStrategyV2: chief coordinating 2 workers and 2 ps" in output
    assert "pixel_embedding table 1088x32, 2 shard(s):" in output
    places = re.findall(r"rows +(\d+)- *(\d+) on (\w+:\d+)", output)
    assert places == [("0", "543", "ps:0"), ("544", "1087", "ps:1")], output[-3000:]
    # one pass over the 1437 training examples per epoch: ceil(1437 / 64) = 23 steps
    assert "optimizer steps: 46 (2 epochs x 23)" in output  # every step of both workers


def test_mixed_precision_computes_in_bfloat16_and_keeps_float32_variables(runs):
    output = _succeeded(runs, "mixed_precision", "MirroredStrategy")
    assert "replicas in sync: 2, precision policy: mixed_bfloat16" in output
    assert "layer hidden: compute dtype bfloat16, variable dtype float32" in output
    assert "layer probabilities: compute dtype float32, variable dtype float32" in output


def test_train_py_learns_digits_on_multi_worker_mirrored(runs):
    output = _succeeded(runs, "train", "CollectiveAllReduceStrategy")
    assert "weights saved to" in output
    # the backup (--backup_dir) was deleted once training had finished
    assert os.listdir(runs["dirs"]["train"]) == ["digits.weights.h5"]
