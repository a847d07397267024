# `make test` and `make demo` set everything up (a virtualenv in .venv) and then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-matrix test-oldest test-next lint demo docs bench clean

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,legacy,docs,bench]"
	touch $(STAMP)

install: $(STAMP)

# Two pytest processes, each running whole test files: a multi-process test leaves the cores
# idle while its processes start, wait on each other or on a timeout, and the other fills them.
XDIST ?= -n 2 --dist loadfile

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

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: $(STAMP)
	$(PY) examples/demo.py

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .nox build *.egg-info
