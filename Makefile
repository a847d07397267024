# `make test` and `make demo` set everything up (a virtualenv in .venv) and then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test demo docs bench clean

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,legacy,docs]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/demo.py

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info
