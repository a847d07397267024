"""When tfdist's keras.distribution support is installed: at `import keras` after `import
tfdist` (never importing TensorFlow before), at `import tfdist` after Keras, never for tf_keras;
and in every task of `tfdist launch` through its start-up hook, which still runs the
environment's own sitecustomize. Each case is a fresh interpreter. (Another Keras backend cannot
be imported here without its library; `install()` checks the backend first.)"""

import os
import subprocess
import sys

import pytest

from tfdist.launcher import startup

CHECK = """
import sys
{first}
print("tensorflow before keras:", "tensorflow" in sys.modules)
{second}
from tfdist.keras_distribution import installed
print("installed:", installed())
"""


def _python(code, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", **env)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environ
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(
    "first, second, env, expected",
    [
        ("import tfdist", "import keras", {}, "tensorflow before keras: False\ninstalled: True"),
        ("import tfdist", "import tensorflow as tf; tf.keras.layers", {}, "installed: True"),
        ("import keras", "import tfdist", {}, "installed: True"),
        ("import tfdist", "import keras", {"TF_USE_LEGACY_KERAS": "1"}, "installed: False"),
    ],
)
def test_installed_when_keras_3_on_tensorflow_is_imported(first, second, env, expected):
    assert expected in _python(CHECK.format(first=first, second=second), **env)


def test_the_launchers_start_up_hook_imports_tfdist_and_chains_to_the_environments(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    code = (
        "import os, sys; print('tfdist:', 'tfdist' in sys.modules, 'theirs:', "
        "os.environ.get('THEIRS'), 'tensorflow:', 'tensorflow' in sys.modules)"
    )
    out = _python(code, PYTHONPATH=os.pathsep.join([startup.FOLDER, str(tmp_path)]))
    assert out.strip() == "tfdist: True theirs: ran tensorflow: False"
