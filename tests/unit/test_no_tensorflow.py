"""What never imports TensorFlow: the unit tier (run in a process of its own that refuses it,
tests/unit/conftest.py), and `import tfdist`, which does only what tfdist/__init__.py says."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import ROOT

UNIT = ROOT / "tests" / "unit"
GUARD = "FORBID_TENSORFLOW"  # the variable that tests/unit/conftest.py reads


def _pytest(*args, cwd):
    """pytest in a new process, with TensorFlow refused; its own pytest variables left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env[GUARD] = "1"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        *args,
    ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def _not_inside_the_guarded_run():
    if os.environ.get(GUARD) == "1":
        pytest.skip("the run that this test starts")


def test_the_unit_tier_imports_no_tensorflow():
    proc = _pytest(str(UNIT), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "TensorFlow in the unit tier" not in proc.stdout


def test_the_guard_fails_a_test_that_imports_tensorflow_or_keras(tmp_path):
    (tmp_path / "conftest.py").write_text((UNIT / "conftest.py").read_text())
    (tmp_path / "test_imports.py").write_text(
        "def test_plain():\n"
        "    pass\n\n\n"
        "def test_imports_tensorflow():\n"
        "    import tensorflow  # noqa: F401\n\n\n"
        "def test_swallows_the_error():\n"
        "    try:\n"
        "        import keras.layers  # noqa: F401\n"
        "    except Exception:\n"
        "        pass\n"
    )
    proc = _pytest(str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout
    assert "A unit test imported 'tensorflow': tests/unit never imports" in proc.stdout
    assert "imported tensorflow by test_imports.py::test_imports_tensorflow" in proc.stdout
    assert "imported keras by test_imports.py::test_swallows_the_error" in proc.stdout


IMPORT_TFDIST = """
import collections.abc, json, os, sys

class Reads(collections.abc.MutableMapping):
    def __init__(self, env):
        self.env, self.names = env, []
    def __getitem__(self, key):
        self.names.append(key)
        return self.env[key]
    def __setitem__(self, key, value):
        self.names.append(key)
        self.env[key] = value
    def __delitem__(self, key):
        self.names.append(key)
        del self.env[key]
    def __iter__(self):
        self.names.append("*")
        return iter(self.env)
    def __len__(self):
        return len(self.env)

before, finders = set(sys.modules), list(sys.meta_path)
os.environ = reads = Reads(os.environ)
import tfdist
os.environ = reads.env
new = sorted(set(sys.modules) - before)
print(json.dumps({
    "tfdist": [m for m in new if m.split(".")[0] == "tfdist"],
    "others": [m for m in new if m.split(".")[0] not in sys.stdlib_module_names | {"tfdist"}],
    "environment": reads.names,
    "finders": [type(f).__name__ for f in sys.meta_path if f not in finders],
}))
"""


def test_import_tfdist_does_what_its_docstring_says():
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_TFDIST], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["tfdist"] == [
        "tfdist",
        "tfdist.cluster",
        "tfdist.cluster.environments",
        "tfdist.cluster.slurm",
        "tfdist.cluster.spec",
        "tfdist.errors",
        "tfdist.keras_distribution",
        "tfdist.keras_distribution.hook",
        "tfdist.releases",
        "tfdist.settings",
    ]
    assert done["others"] == []  # the standard library only: no TensorFlow, Keras or NumPy
    assert done["environment"] == []  # neither read nor written
    assert done["finders"] == ["_KerasFinder"]
