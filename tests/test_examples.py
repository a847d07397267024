"""The examples run, with small settings, so they cannot rot (three jobs at once)."""

import concurrent.futures
import io
import os
import re
import subprocess
import sys

import pytest

from tfdist.launcher import launch

pytestmark = pytest.mark.slow

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")
TRAIN = os.path.join(EXAMPLES, "train.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _mirrored(tmp):
    proc = subprocess.run([sys.executable, TRAIN, "--virtual_cpus", "2", "--epochs", "3",
                           "--model_dir", tmp], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **ENV))
    return proc.returncode, proc.stdout + proc.stderr


def _launched(tmp, **job):
    out = io.StringIO()
    codes = launch(TRAIN, ["--epochs", "3", "--model_dir", tmp] + job.pop("args", []),
                   out=out, timeout=600, extra_env=ENV, **job)
    return (0 if all(c == 0 for c in codes.values()) else 1), out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = {"mirrored": (_mirrored, {}),
            "multi_worker_mirrored": (_launched, {"workers": 2}),
            "parameter_server": (_launched, {"workers": 2, "ps": 1,
                                             "args": ["--embedding_shards", "1"]})}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(fn, str(tmp_path_factory.mktemp(name)), **kwargs)
                   for name, (fn, kwargs) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name, strategy", [
    ("mirrored", "MirroredStrategy"),
    ("multi_worker_mirrored", "CollectiveAllReduceStrategy"),
    ("parameter_server", "ParameterServerStrategyV2")])
def test_train_example_learns_digits_on_every_strategy(runs, name, strategy):
    code, output = runs[name]
    assert code == 0, output[-3000:]
    found = re.search(rf"{strategy}: held-out accuracy ([0-9.]+) \(chance 0.100\)", output)
    assert found, output[-3000:]
    assert float(found.group(1)) > 0.6  # well above chance after 3 short epochs
    assert "weights saved to" in output and output.count("held-out accuracy") == 1
