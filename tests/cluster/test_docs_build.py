"""The documentation builds without warnings, and its Python examples run.

Every ```python block of docs/**/*.md is executed. The blocks of one page run in order in one
process of its own (like cells of a notebook: later blocks use what earlier ones defined), on CPUs,
in an empty working directory, with no TF_CONFIG or TFDIST_* variable set. A block that cannot
run there (it needs a cluster or a GPU) carries a title containing "not run":

    ```python title="on every GPU worker (not run by the tests)"

and only a few blocks may do so.
"""

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tfdist import settings
from tfdist.launcher import preload

from helpers.docs import PAGES, ROOT

PAGE_TIMEOUT = 240  # seconds for all blocks of one page

# Runs the blocks of one page. Each block is compiled with the Markdown file as its file name
# and with its own line numbers there, so tracebacks point into the page, and
# inspect.getsource (which AutoGraph uses for tf.function) finds the code in it.
RUNNER = r"""
import json, os, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    code = "\n" * (block["line"] - 1) + block["code"]
    try:
        exec(compile(code, block["page"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(1)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # skip interpreter teardown: gRPC servers started by a page may not stop cleanly
"""


def clean_env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TFDIST_")
        and k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES", "PYTEST_ADDOPTS")
    }
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_page(page: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="tfdist-docs-") as cwd:
        blocks_file = os.path.join(cwd, "blocks.json")
        with open(blocks_file, "w") as f:
            json.dump(PAGES[page], f)
        runner = os.path.join(cwd, "run_blocks.py")
        with open(runner, "w") as f:
            f.write(RUNNER)
        env = clean_env()
        argv = [sys.executable, runner, blocks_file]
        if settings.PRELOAD.get():  # forked from a process that imported TensorFlow once
            argv = preload.task_argv(argv, env)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=PAGE_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            code = None
            output = f"timed out after {PAGE_TIMEOUT} s\n{err.stdout or ''}{err.stderr or ''}"
        return {"returncode": code, "output": output, "seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def page_runs():
    """Every page's blocks, pages in parallel (one per core), each in a process of its own."""
    workers = max(1, min(len(PAGES), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(PAGES, pool.map(run_page, PAGES)))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_python_blocks_of_the_page_run(page, page_runs):
    run = page_runs[page]
    assert run["returncode"] == 0, (
        f"{page} (exit code {run['returncode']}):\n" + run["output"][-6000:]
    )


def test_the_site_builds_without_warnings(tmp_path):
    missing = [
        name
        for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        pytest.skip(
            f"the docs tools are not installed ({', '.join(missing)}): pip install -e '.[docs]'"
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--clean",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )  # mkdocs-material's banner
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "training" / "index.html").exists()
