"""The version matrix: the README's scenarios on every TensorFlow / Keras pair tfdist supports.

    make test-matrix                    # every pair of tfdist.releases.MATRIX, then the table
    nox -s "matrix(tf2.16.2-keras3.3.3)" table   # one pair
    nox -s oldest                       # the oldest pair (CI: after the full suite on the newest)

Each pair gets its own virtualenv (uv, keyed by the pair, reused on the next run: a warm run
installs nothing), with exactly that TensorFlow, Keras and tf_keras and this checkout. It runs
the tests marked `scenario` (real multi-process jobs, Keras 3 and tf_keras) and writes each
scenario's outcome to .nox/results/<pair>.json; the `table` session prints pair by scenario.
"""

import json
import pathlib
import sys
import time

import nox

ROOT = pathlib.Path(__file__).parent
sys.path.insert(0, str(ROOT))
from tfdist.releases import MATRIX, OLDEST  # noqa: E402  (pure Python, no TensorFlow)

RESULTS = ROOT / ".nox" / "results"

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["matrix", "table"]


@nox.session
@nox.parametrize("release", [r.name for r in MATRIX], ids=[r.name for r in MATRIX])
def matrix(session, release):
    """The scenario tests on one pair (pytest arguments after `--` are passed on)."""
    pins = next(r for r in MATRIX if r.name == release).pins()
    session.install(*pins, "-e", ".[test,legacy]")
    # uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set no process does: then every
    # process of every job compiles TensorFlow's Python anew (about 2.5x the CPU of an import of
    # compiled modules). Compile once here; an up-to-date tree costs only the checks.
    session.run("python", "-m", "compileall", "-q", "-j0", _site_packages(session), silent=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / f"{release}.json"
    report.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        session.run(
            "python", "-m", "pytest", "-q", "-m", "scenario", "-p", "no:cacheprovider",
            "-n", "2", "--dist", "loadfile",
            f"--scenario-report={report}", *session.posargs,
            env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        )  # fmt: skip
    finally:
        if report.exists():
            data = json.loads(report.read_text())
            data["_seconds"] = round(time.monotonic() - started)
            report.write_text(json.dumps(data, indent=1, sort_keys=True))


def _site_packages(session):
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return session.run("python", "-c", code, silent=True).strip()


@nox.session(python=False)
def oldest(session):
    """The scenario tests on the oldest pair, then the table (CI runs this; pytest arguments
    after `--` are passed on)."""
    session.notify(f"matrix({OLDEST.name})", session.posargs)
    session.notify("table")


@nox.session(python=False)
def table(session):
    """Prints the matrix table (scenario by pair) from .nox/results/*.json."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.matrix_table import render

    print(render(RESULTS, [r.name for r in MATRIX]))
