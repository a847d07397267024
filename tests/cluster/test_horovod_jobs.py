"""Horovod scripts as real local jobs of `tfdist horovodrun`: every collective on 3 processes,
and the three example scripts (model.fit with DistributedOptimizer and the callbacks, a custom
loop with DistributedGradientTape, the synthetic benchmark) on 1 and 2 processes, under Keras
3 and tf_keras. The scripts import `horovod...` unmodified: Horovod is not installed here, so
tfdist's modules serve the import.

Every job of the module runs once, two at a time, in the `jobs` fixture; the tests read what
they wrote.
"""

import concurrent.futures
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.paths import EXAMPLES, SCRIPTS

pytestmark = pytest.mark.slow

TIMEOUT = 420
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}


def horovodrun(np_, script, args=(), env=None, flags=()):
    """Runs `tfdist horovodrun -np N python SCRIPT ARGS`; returns (exit code, output)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist", "horovodrun", "-np", str(np_), *flags]
        + ["python", str(script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})),
    )
    return proc.returncode, proc.stdout + proc.stderr


def _fit(out, np_, *extra, env=None):
    args = ["--out", str(out), "--warmup-epochs", "0", *extra]
    return (np_, EXAMPLES / "horovod" / "keras_fit.py", args, env)


def _loop(out, np_, env=None):
    return (np_, EXAMPLES / "horovod" / "custom_loop.py", ["--out", str(out)], env)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("horovod")
    plans = {
        "collectives": (3, SCRIPTS / "horovod_collectives.py", [str(base)], None),
        "fit 1": _fit(base / "fit1", 1),
        "fit 2": _fit(base / "fit2", 2),
        "fit 2 fp16": _fit(base / "fit2fp16", 2, "--compression", "fp16"),
        "fit 1 passes": _fit(base / "pass1", 1, "--backward-passes-per-step", "2"),
        "fit 2 passes": _fit(base / "pass2", 2, "--backward-passes-per-step", "2"),
        "fit 2 warmup": (
            2,
            EXAMPLES / "horovod" / "keras_fit.py",
            ["--out", str(base / "warmup"), "--warmup-epochs", "2", "--epochs", "2"],
            None,
        ),
        "loop 1": _loop(base / "loop1", 1),
        "loop 2": _loop(base / "loop2", 2),
        "tf_keras fit 1": _fit(base / "kfit1", 1, env=LEGACY),
        "tf_keras fit 2": _fit(base / "kfit2", 2, "--backward-passes-per-step", "1", env=LEGACY),
        "tf_keras loop 1": _loop(base / "kloop1", 1, env=LEGACY),
        "tf_keras loop 2": _loop(base / "kloop2", 2, env=LEGACY),
        "benchmark none": (
            2,
            EXAMPLES / "horovod" / "synthetic_benchmark.py",
            ["--width", "256", "--num-iters", "2", "--json", str(base / "none.json")],
            None,
        ),
        "benchmark fp16": (
            2,
            EXAMPLES / "horovod" / "synthetic_benchmark.py",
            ["--width", "256", "--num-iters", "2", "--json", str(base / "fp16.json")]
            + ["--fp16-allreduce"],
            None,
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(horovodrun, np_, script, args, env)
            for name, (np_, script, args, env) in plans.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    return base, results


def _ok(jobs, *names):
    _, results = jobs
    for name in names:
        code, output = results[name]
        assert code == 0, f"{name}: exit {code}\n{output[-4000:]}"


def _weights(folder, rank=0):
    with np.load(os.path.join(folder, f"weights-rank{rank}.npz")) as data:
        return [data[key] for key in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def _same_on_both_ranks_and_as_one_process(one, two):
    for a, b in zip(_weights(two, 0), _weights(two, 1)):
        np.testing.assert_array_equal(a, b)  # every rank applied the same reduced gradients
    for a, b in zip(_weights(one), _weights(two)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _history(folder, rank=0):
    with open(os.path.join(folder, f"history-rank{rank}.json")) as f:
        return json.load(f)


def test_every_collective_on_three_processes(jobs):
    _ok(jobs, "collectives")
    base, _ = jobs
    reports = [json.loads((base / f"rank{r}.json").read_text()) for r in range(3)]
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"]) for r in reports] == [
        (0, 3, 0, 3),
        (1, 3, 1, 3),
        (2, 3, 2, 3),
    ]
    assert {(r["cross_rank"], r["cross_size"]) for r in reports} == {(0, 1)}
    assert [r["environment_rank"] for r in reports] == ["0", "1", "2"]  # HOROVOD_RANK, set
    assert len(reports[0]["checked"]) >= 40
    assert reports[0]["checked"] == reports[2]["checked"]


def test_keras_fit_on_two_processes_equals_one(jobs):
    _ok(jobs, "fit 1", "fit 2")
    base, results = jobs
    _same_on_both_ranks_and_as_one_process(base / "fit1", base / "fit2")
    one, two = _history(base / "fit1"), _history(base / "fit2")
    # MetricAverageCallback: the averaged epoch logs are the one-process ones
    np.testing.assert_allclose(two["history"]["loss"], one["history"]["loss"], rtol=1e-5)
    np.testing.assert_allclose(two["history"]["accuracy"], one["history"]["accuracy"], rtol=1e-5)
    assert _history(base / "fit2", 1)["history"]["loss"] == two["history"]["loss"]
    # rank 0 alone wrote the checkpoints
    assert sorted(p.name for p in (base / "fit2").glob("checkpoint-*")) == [
        "checkpoint-1.weights.h5",
        "checkpoint-2.weights.h5",
        "checkpoint-3.weights.h5",
    ]
    assert "rank 1 of 2" in results["fit 2"][1]


def test_tf_keras_fit_on_two_processes_equals_one(jobs):
    _ok(jobs, "tf_keras fit 1", "tf_keras fit 2")
    base, _ = jobs
    _same_on_both_ranks_and_as_one_process(base / "kfit1", base / "kfit2")


def test_custom_loops_on_two_processes_equal_one(jobs):
    _ok(jobs, "loop 1", "loop 2", "tf_keras loop 1", "tf_keras loop 2")
    base, _ = jobs
    _same_on_both_ranks_and_as_one_process(base / "loop1", base / "loop2")
    _same_on_both_ranks_and_as_one_process(base / "kloop1", base / "kloop2")
    losses = json.loads((base / "loop2" / "losses-rank0.json").read_text())
    assert losses[-1] < 0.5 * losses[0]


def test_backward_passes_per_step_applies_every_second_step(jobs):
    _ok(jobs, "fit 1 passes", "fit 2 passes", "fit 1")
    base, _ = jobs
    _same_on_both_ranks_and_as_one_process(base / "pass1", base / "pass2")
    # 3 epochs of 16 batches: 48 backward passes, 24 applied steps
    assert _history(base / "pass2")["iterations"] == 24
    assert _history(base / "fit1")["iterations"] == 48
    with pytest.raises(AssertionError):  # the accumulation changes the training
        np.testing.assert_allclose(_weights(base / "pass1")[0], _weights(base / "fit1")[0])


def test_learning_rate_warmup_follows_horovods_schedule(jobs):
    _ok(jobs, "fit 2 warmup")
    base, _ = jobs
    lr = _history(base / "warmup")["history"]["lr"]
    # epoch e ends at 1/size * ((e + 1) * (size - 1) / warmup + 1) of the initial rate 0.05
    np.testing.assert_allclose(lr, [0.05 * 0.5 * (1 * 1 / 2 + 1), 0.05], rtol=1e-6)


def test_fp16_compression_halves_the_bytes_and_keeps_the_loss(jobs):
    _ok(jobs, "fit 2", "fit 2 fp16", "benchmark none", "benchmark fp16")
    base, results = jobs
    none = json.loads((base / "none.json").read_text())
    fp16 = json.loads((base / "fp16.json").read_text())
    assert none["payload_bytes_per_step"] == 4 * none["parameters"]
    assert fp16["payload_bytes_per_step"] == 2 * none["parameters"]
    assert "Total examples/sec on 2 processes" in results["benchmark fp16"][1]
    plain = _history(base / "fit2")["history"]["loss"][-1]
    half = _history(base / "fit2fp16")["history"]["loss"][-1]
    assert abs(half - plain) <= 0.01 * plain, (plain, half)
    assert half != plain  # the gradients did travel as float16


def test_init_after_tensorflow_started_is_a_clear_error(tmp_path):
    script = tmp_path / "late_init.py"
    script.write_text(
        "import tensorflow as tf\n"
        "tf.constant(1.0) + 1\n"
        "import horovod.tensorflow as hvd\n"
        "hvd.init()\n"
    )
    code, output = horovodrun(2, script, flags=["--start-timeout", "60"])
    assert code != 0
    assert "hvd.init() must run before TensorFlow starts" in output
    assert "HINT: call hvd.init() first thing" in output


def test_an_installed_horovod_is_never_shadowed(tmp_path):
    fake = tmp_path / "site" / "horovod" / "tensorflow"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("WHO = 'the installed horovod'\n")
    script = tmp_path / "which.py"
    script.write_text("import horovod.tensorflow as hvd\nprint('imported', hvd.WHO)\n")
    paths = [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, paths))}
    code, output = horovodrun(1, script, env=env)
    assert code == 0, output
    assert "imported the installed horovod" in output
    assert "warning: Horovod is installed" in output
