"""Tests that read the task context start with no task set and no cluster in the
environment (the precision tests: the chief-only messages read it)."""

import pytest

from tfdist import task


@pytest.fixture(autouse=True)
def no_task_set(monkeypatch):
    monkeypatch.setattr(task, "_CURRENT", [])
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
