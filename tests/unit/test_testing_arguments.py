"""tfdist.testing refuses what its child processes could not import or use: run_cluster's and
assert_same_training's arguments, and `tfdist verify`'s script."""

import numpy as np
import pytest

from tfdist import cli
from tfdist.testing import compare_training, run_cluster


def local_function_holder():
    def inner():
        return 1

    return inner


def test_run_cluster_needs_an_importable_function():
    with pytest.raises(TypeError, match="needs a module-level function"):
        run_cluster(local_function_holder())


# ------------------------------------------------ assert_same_training: refused before any process


def build_model():
    raise AssertionError("never called: arguments are checked first")


X = np.zeros((8, 4), "float32")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"build_model": local_function_holder()}, TypeError, "needs a module-level function"),
        ({"data": "examples.csv"}, TypeError, r"data must be \(x, y\).*HINT: pass the arrays"),
        ({"data": (X, X[:5])}, ValueError, r"same number of examples.*'data\[1\]': 5"),
        ({"global_batch_size": 0}, ValueError, "global_batch_size=0 must be a positive integer"),
        ({"steps": 2.5}, ValueError, "steps=2.5 must be a positive integer"),
        (
            {"strategies": ("one_device", "mirror")},
            ValueError,
            r"\['one_device', 'mirror'\].*HINT: choose from \['one_device', 'mirrored'",
        ),
        ({"strategies": ()}, ValueError, "distinct strategy names"),
        ({"rtol": -1}, ValueError, r"rtol=-1 must be a number in \[0, 1\)"),
        (
            {"random_layers": "on"},
            ValueError,
            r"random_layers='on' is not one of \['off', 'keep'\]",
        ),
    ],
)
def test_compare_training_refuses_bad_arguments_before_starting_anything(kwargs, error, message):
    arguments = {"build_model": build_model, "data": (X, X), "global_batch_size": 4, **kwargs}
    with pytest.raises(error, match=message):
        compare_training(arguments.pop("build_model"), arguments.pop("data"), **arguments)


def test_tfdist_verify_names_what_the_script_lacks(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "missing.py")]) == 2
    assert "No such script" in capsys.readouterr().out
    script = tmp_path / "no_model.py"
    script.write_text("DATA = ([[1.0]], [[2.0]])\n")
    assert cli.main(["verify", str(script)]) == 2
    assert "defines no build_model(). HINT" in capsys.readouterr().out
    script.write_text("def build_model():\n    pass\n")
    assert cli.main(["verify", str(script)]) == 2
    assert "defines neither data() nor DATA" in capsys.readouterr().out
    script.write_text("def build_model():\n    pass\nDATA = ([[1.0]], [[2.0]])\n")
    assert cli.main(["verify", str(script)]) == 2
    assert "sets no GLOBAL_BATCH_SIZE. HINT" in capsys.readouterr().out
    bad = tmp_path / "my-model.py"
    bad.write_text("")
    assert cli.main(["verify", str(bad)]) == 2
    assert "is not a Python module name" in capsys.readouterr().out
