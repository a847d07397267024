"""tfdist.launcher.preload's decisions, without starting anything: which command lines can be
forked from a preloader, and which environments need a preloader of their own."""

import sys

from tfdist.launcher import preload


def test_scripts_and_modules_of_this_interpreter_are_forkable():
    assert preload.forkable([sys.executable, "train.py", "--epochs", "3"])
    assert preload.forkable([sys.executable, "-m", "tfdist.launcher.run_function", "a"])


def test_other_command_lines_start_fresh():
    assert not preload.forkable(["/usr/bin/python3.9", "train.py"])  # another interpreter
    assert not preload.forkable([sys.executable, "-c", "print(1)"])
    assert not preload.forkable([sys.executable, "-X", "importtime", "train.py"])
    assert not preload.forkable([sys.executable, "-m"])
    assert not preload.forkable([sys.executable])
    assert preload.task_argv([sys.executable, "-c", "pass"], {}) == [sys.executable, "-c", "pass"]


def test_what_tensorflow_reads_at_import_keys_the_preloader():
    base = {"HOME": "/root", "TF_CPP_MIN_LOG_LEVEL": "2"}
    same = dict(
        base,
        TF_CONFIG='{"cluster": {}}',
        TFDIST_TASK="worker:1",
        PYTHONPATH="/tmp/tests",
        PYTHONUNBUFFERED="1",
        PYTEST_CURRENT_TEST="x",
        OUT_DIR="/tmp/out",
    )
    assert preload.key(same) == preload.key(base) == (("TF_CPP_MIN_LOG_LEVEL", "2"),)
    for name, value in [
        ("TF_USE_LEGACY_KERAS", "1"),
        ("TF_CPP_MIN_LOG_LEVEL", "0"),
        ("KERAS_BACKEND", "jax"),
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("OMP_NUM_THREADS", "1"),
        ("PYTHONHASHSEED", "0"),
    ]:
        assert preload.key(dict(base, **{name: value})) != preload.key(base), name
