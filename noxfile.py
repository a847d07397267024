"""The version matrix: the README's scenarios on every TensorFlow / Keras pair tfdist supports.

    make test-matrix                    # every pair of tfdist.releases.MATRIX, then the table
    nox -s "matrix(tf2.16.2-keras3.3.3)" table   # one pair
    nox -s oldest                       # the oldest pair (CI: after the full suite on the newest)
    make test-next                      # the next Keras: keras-nightly on TF and on tf-nightly

Each pair gets its own virtualenv (uv, keyed by the pair, reused on the next run: a warm run
installs nothing), with exactly that TensorFlow, Keras and tf_keras and this checkout. It runs
the tests marked `scenario` (real multi-process jobs, Keras 3 and tf_keras) and writes each
scenario's outcome to .nox/results/<pair>.json; the `table` session prints pair by scenario.

The `next` session does the same for the next Keras (tfdist.releases.NEXT_RELEASE): the
keras-nightly build named there, or KERAS_NIGHTLY=<version> (or "latest"), on the matrix's
newest TensorFlow and on tf-nightly-cpu (TF_NIGHTLY=<version>, "latest", or "" to skip it).
Its columns ("next ...") are added to the table.
"""

import json
import os
import pathlib
import sys
import time

import nox

ROOT = pathlib.Path(__file__).parent
sys.path.insert(0, str(ROOT))
from tfdist.releases import MATRIX, NEXT_RELEASE, OLDEST  # noqa: E402  (pure Python, no TF)

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
    _scenarios(session, release)


def _scenarios(session, name):
    """Compiles the venv's modules, runs the scenario tests, writes .nox/results/<name>.json."""
    # uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set no process does: then every
    # process of every job compiles TensorFlow's Python anew (about 2.5x the CPU of an import of
    # compiled modules). Compile once here; an up-to-date tree costs only the checks.
    site_packages = _site_packages(session)
    if not site_packages:
        return  # nox --install-only: nothing runs
    session.run("python", "-m", "compileall", "-q", "-j0", site_packages, silent=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / f"{name}.json"
    report.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        session.run(
            "python", "-m", "pytest", "-q", "-m", "scenario", "-p", "no:cacheprovider",
            "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder",
            f"--scenario-report={report}", *session.posargs,
            env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        )  # fmt: skip
    finally:
        if report.exists():
            data = json.loads(report.read_text())
            data["_seconds"] = round(time.monotonic() - started)
            report.write_text(json.dumps(data, indent=1, sort_keys=True))


# The next Keras on the newest TensorFlow, and on tf-nightly (see the module's docstring).
NEXT_TENSORFLOWS = ["release", "nightly"]


@nox.session(name="next")
@nox.parametrize("tensorflow", NEXT_TENSORFLOWS, ids=NEXT_TENSORFLOWS)
def next_keras(session, tensorflow):
    """The scenario tests on keras-nightly (pytest arguments after `--` are passed on); then
    the table, with a "next" column per TensorFlow."""
    nightly = _pinned("keras-nightly", "KERAS_NIGHTLY", NEXT_RELEASE.nightly)
    # keras-nightly, tf-nightly-cpu and tf-keras-nightly install the packages `keras`,
    # `tensorflow` and `tf_keras` that TensorFlow, tf_keras and tfdist require by the release
    # distributions' names: those requirements are dropped, or both would write one package.
    dropped = ["keras"]
    if tensorflow == "release":
        pins = [f"tensorflow=={NEXT_RELEASE.tensorflow}", nightly,
                f"tf-keras=={NEXT_RELEASE.tf_keras}"]  # fmt: skip
    else:
        if not os.environ.get("TF_NIGHTLY", NEXT_RELEASE.tf_nightly):
            session.skip("TF_NIGHTLY is empty: no tf-nightly run")
        pins = [
            _pinned("tf-nightly-cpu", "TF_NIGHTLY", NEXT_RELEASE.tf_nightly),
            nightly,
            _pinned("tf-keras-nightly", "TF_KERAS_NIGHTLY", NEXT_RELEASE.tf_keras_nightly),
        ]
        dropped += ["tensorflow", "tf-nightly", "tf-keras"]
    overrides = pathlib.Path(session.create_tmp()) / "overrides.txt"
    overrides.write_text("".join(f'{name} ; sys_platform == "never"\n' for name in dropped))
    session.install(
        *pins, "-e", ".[test,legacy]", "--prerelease", "allow", "--override", str(overrides)
    )
    tf_version = _installed(session, "tensorflow" if tensorflow == "release" else "tf-nightly-cpu")
    keras_version = _installed(session, "keras-nightly")
    if not keras_version:
        return  # nox --install-only: nothing ran
    if _installed(session, "keras") != "-":
        session.error("The `keras` release is installed beside keras-nightly: remove the venv.")
    _scenarios(session, f"next-tf{tf_version}-keras{keras_version}")
    session.notify("table")


def _pinned(package, variable, default):
    """`package==<version>` from the environment `variable` (or `default`); "latest": the
    newest build."""
    version = os.environ.get(variable) or default
    return package if version == "latest" else f"{package}=={version}"


def _installed(session, distribution):
    """The version of `distribution` in the session's venv, "-" when it is not installed
    ("" under nox --install-only). Reads metadata: imports no TensorFlow."""
    code = (
        "from importlib import metadata\n"
        "try: print(metadata.version(%r))\n"
        "except metadata.PackageNotFoundError: print('-')" % distribution
    )
    return (session.run("python", "-c", code, silent=True) or "").strip()


def _site_packages(session):
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return (session.run("python", "-c", code, silent=True) or "").strip()


@nox.session(python=False)
def oldest(session):
    """The scenario tests on the oldest pair, then the table (CI runs this; pytest arguments
    after `--` are passed on)."""
    session.notify(f"matrix({OLDEST.name})", session.posargs)
    session.notify("table")


@nox.session(python=False)
def table(session):
    """Prints the matrix table (scenario by pair, then the next Keras's runs) from
    .nox/results/*.json."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.matrix_table import columns, render

    print(render(RESULTS, columns(RESULTS, [r.name for r in MATRIX])))
