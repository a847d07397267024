# `make test` and `make demo` set everything up (a virtualenv in .venv) and then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-matrix test-oldest test-next test-gpu chaos lint demo docs bench wheel-smoke clean

# torch (the "gloo" extra) is PyTorch's CPU build, from PyTorch's index where it is reachable
# (PyPI's default build is CUDA's, several GB); --retries 0: an unreachable index costs nothing.
TORCH       ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --retries 0 "$(TORCH)" --extra-index-url $(TORCH_INDEX)
	$(PY) -m pip install --quiet -e ".[test,legacy,docs,gloo,notebook]"
	touch $(STAMP)

install: $(STAMP)

# The benchmarks' charts need matplotlib (the "bench" extra), which `make bench` adds on its
# first run. It stays out of the tests' virtualenv: Keras imports it whenever it is installed,
# into every TensorFlow process the tests start (a third of a second of CPU each).
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $(BENCH_STAMP)

# Two pytest processes, each running whole test files: a multi-process test leaves the cores
# idle while its processes start, wait on each other or on a timeout, and the other fills them.
# Files go in the order tests/conftest.py gives (longest first), not sorted by test count.
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The version matrix (tfdist/releases.py): the README's scenarios on every TensorFlow / Keras
# pair, each in its own uv virtualenv under .nox (reused), then one table. NOX_ARGS narrows it.
test-matrix: $(STAMP)
	$(VENV)/bin/nox $(NOX_ARGS)

# The scenarios on the oldest pair only (CI runs this after `make test` on the newest).
test-oldest: $(STAMP)
	$(VENV)/bin/nox -s oldest $(NOX_ARGS)

# The next Keras (tfdist.releases.NEXT_RELEASE): the scenarios on keras-nightly with the newest
# TensorFlow and with tf-nightly, then the table with their columns. KERAS_NIGHTLY=<version> or
# latest tries another build; TF_NIGHTLY= (empty) skips the tf-nightly run.
test-next: $(STAMP)
	$(VENV)/bin/nox -s next $(NOX_ARGS)

# The prepared GPU check, for a Linux machine with an NVIDIA GPU and nothing but Python and pip:
# builds its own venv (build/gpu-venv: TensorFlow with CUDA, Keras, tf_keras, this checkout),
# runs each step bounded and on its own, within 8 minutes, and writes gpu-check.md and
# gpu-check.json to $(OUT) when set, else to a folder it prints (tests/gpu/gpu_check.py).
# GPU_ARGS="--rehearse" runs it on CPUs.
test-gpu:
	$(PYTHON) tests/gpu/gpu_check.py $(GPU_ARGS)

# The fault-injection campaign (tests/chaos/campaign.py): TRIALS real jobs under tfdist launch
# (2 or 3 workers, or 2 workers and 1 or 2 ps, drawn from SEED), each with one or two faults at
# random steps (SIGKILL, SIGTERM, SIGSTOP, a network cut, a full disk, a corrupt backup, the
# launcher killed), every trial judged; chaos.md and chaos.json go to $(OUT) when set, else to
# build/chaos-<time>. Under a minute a trial on 2 cores (30-70 s; 2 minutes with two restarts).
TRIALS ?= 100
SEED   ?= 1
chaos: $(STAMP)
	$(PY) tests/chaos/campaign.py --trials $(TRIALS) --seed $(SEED)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: $(STAMP)
	$(PY) examples/demo.py

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(BENCH_STAMP)
	$(PY) benchmarks/run.py

# The wheel as a user installs it into a project of their own: built from this checkout, put
# with its examples extra into a fresh virtualenv (uv, from its cache of wheels: no editable
# install, no test extras), then examples/train.py run with that virtualenv's `tfdist launch`
# as a 2-worker job, from outside the checkout, so that the installed tfdist is the one used.
SMOKE ?= build/wheel-smoke

wheel-smoke: $(STAMP)
	rm -rf dist $(SMOKE)
	$(VENV)/bin/uv build --quiet --wheel --out-dir dist .
	$(VENV)/bin/uv venv --quiet --python $(PYTHON) $(SMOKE)
	$(VENV)/bin/uv pip install --quiet --python $(SMOKE)/bin/python \
		"$$(ls dist/tfdist-*-py3-none-any.whl)[examples]"
	$(SMOKE)/bin/python -m compileall -q -j0 $(SMOKE)/lib > /dev/null  # once, not in each task
	cd $(SMOKE) && bin/python -c "import tfdist; print('tfdist', tfdist.__version__, \
		'from', tfdist.__file__); assert 'site-packages' in tfdist.__file__"
	cd $(SMOKE) && ! bin/python -c "import pytest" 2>/dev/null  # no test extras
	cd $(SMOKE) && bin/tfdist launch --workers 2 $(CURDIR)/examples/train.py --epochs 2

clean:
	rm -rf $(VENV) .nox build dist *.egg-info
