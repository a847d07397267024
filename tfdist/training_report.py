"""What a task of a `tfdist launch` job trained, for the launcher's summary line.

A leaf below the strategy (which installs it) and the launcher (which reads it).

The launcher gives each task a file path in TFDIST_REPORT_FILE. In such a task,
`make_strategy` calls `install()`, which wraps Keras' `CallbackList.on_train_begin` /
`on_train_end` (of the Keras the process uses, Keras 3 or tf_keras): every `fit` in the
process, Keras' own or tfdist's parameter-server loop, adds the growth of its optimizer's
`iterations` and its wall time to the file, rewritten whole after each fit. A task that would
fail the same way if it ran again (a backup that does not match the model) says so in the file
too (`refuse_restart`), and the launcher does not restart the job. The launcher reads the file
when the task has ended. Nothing is written without TFDIST_REPORT_FILE, and a report that
cannot be read or written costs nothing but the steps/s of the summary (and a restart).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Optional

from tfdist import settings

_LOCK = threading.Lock()
_TOTALS = {"steps": 0, "seconds": 0.0, "fits": 0}
_INSTALLED = False


def _iterations(callbacks) -> Optional[int]:
    optimizer = getattr(getattr(callbacks, "model", None), "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    if iterations is None:
        return None
    try:
        return int(iterations.numpy())
    except Exception:  # pylint: disable=broad-except
        return None  # a counter that cannot be read here: no steps/s, training unaffected


def _write(path: str) -> None:
    with _LOCK:
        payload = dict(_TOTALS)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(payload, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def read(path: str) -> Optional[dict]:
    """The report at `path`: {"steps", "seconds", "fits"}, with "not_restartable" (why) where
    the task refused a restart; or None (none written, unreadable)."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not (report.get("fits") or report.get("not_restartable")):
        return None
    return report


def refuse_restart(reason: str) -> None:
    """Tells the launcher that this task would fail the same way if the job ran again (`reason`,
    the error it raises): the launcher does not restart the job. Does nothing outside the
    launcher (no TFDIST_REPORT_FILE)."""
    path = settings.REPORT_FILE.get()
    if not path:
        return
    with _LOCK:
        _TOTALS["not_restartable"] = reason
    _write(path)


def install() -> bool:
    """Counts training steps of every fit in this process when TFDIST_REPORT_FILE is set.

    Returns True when the counting is (already) installed.
    """
    global _INSTALLED
    path = settings.REPORT_FILE.get()
    if not path:
        return False
    with _LOCK:
        if _INSTALLED:
            return True
        _INSTALLED = True
    from tfdist import flavour

    callback_list = flavour.keras().callbacks.CallbackList
    begin, end = callback_list.on_train_begin, callback_list.on_train_end

    def on_train_begin(self, logs=None):
        started = time.monotonic()
        result = begin(self, logs)
        # counted after the callbacks' own on_train_begin: BackupAndRestore may restore a
        # later optimizer step there, and the steps before it were not trained by this fit
        self._tfdist_report_start = (_iterations(self), started)
        return result

    def on_train_end(self, logs=None):
        result = end(self, logs)
        start = getattr(self, "_tfdist_report_start", None)
        if start is not None:
            first, started = start
            last = _iterations(self)
            with _LOCK:
                _TOTALS["fits"] += 1
                _TOTALS["seconds"] += time.monotonic() - started
                if first is not None and last is not None:
                    _TOTALS["steps"] += max(last - first, 0)
            _write(path)
        return result

    callback_list.on_train_begin = on_train_begin
    callback_list.on_train_end = on_train_end
    return True
