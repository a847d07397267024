"""Which lines of a task's output are TensorFlow's start-up noise, hidden by the launcher.

Every TensorFlow process prints C++ log lines at start-up (oneDNN, the CUDA stubs, CPU
features, the coordination service; on a host without GPU even an "E" line, "failed call to
cuInit"), some of them twice, and a multi-worker strategy used eagerly warns on every run. The
launcher forwards a task's lines to the terminal without them, unless `--verbose` or
TFDIST_VERBOSE=1, and the last lines of a failed task that the launcher quotes go without them
too. A task's output as the launcher keeps it (`TaskResult.output`) and its `--log-dir` file
keep every line.

A line is noise when it is:
- a C++ log line of level I (absl: `I0000 00:00:1796148415.137614   23634 port.cc:153] ...`;
  TensorFlow 2.16: `2026-12-01 18:06:44.175066: I tensorflow/core/util/port.cc:113] ...`);
- a C++ log line of level W or E whose text is one of the known harmless ones below;
- absl's `WARNING: All log messages before absl::InitializeLog() is called ...`;
- TensorFlow's Python warning "Using CollectiveAllReduceStrategy eagerly has significant
  overhead";
- a known continuation line of a hidden line (the CPU-feature list, a straggler's name), or a
  line of the text proto a hidden "SessionOptions: goo.gle/debugproto" line announces.

Every other W and E line is shown, and so is every F (fatal) line: errors are never hidden.
"""

from __future__ import annotations

import re

__all__ = ["NoiseFilter", "is_cpp_log_line"]

_ABSL = r"(?P<absl>[IWEF])\d{4} \d\d:\d\d:[\d.]+ +\d+ [^\s\]]+:\d+\] "
_TF216 = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<tf>[IWEF]) [^\s\]]+:\d+\] "
_CPP_LINE = re.compile(f"^(?:{_ABSL}|{_TF216})")

# W and E lines every CPU-only start-up prints, and those of a normal shutdown.
_HARMLESS = re.compile(
    "|".join(
        (
            r"failed call to cuInit",
            r"Unable to register cu\w+ factory",
            r"Attempting to register factory for plugin",
            r"already (?:been )?registered",
            r"TF-TRT Warning: Could not find TensorRT",
            r"Could not find cuda drivers",
            r"Unable to destroy server_ object, so releasing instead",
            r"Using CollectiveAllReduceStrategy eagerly has significant overhead",
            r"oneDNN supports DT_HALF only on platforms with AVX-512",
            r"will not be optimized because the dataset does not implement the "
            r"AsGraphDefInternal\(\) method",
        )
    )
)
_LINES = re.compile(
    r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead)"
)
_CONTINUATIONS = re.compile(
    r"^(?:To enable the following instructions: .*rebuild TensorFlow.*"
    r"|/job:\w+/replica:\d+/task:\d+)$"
)
# A hidden line that announces a multi-line dump (eager_service_impl.cc's "SessionOptions:
# goo.gle/debugproto" and a text proto), and the lines of such a dump.
_DUMP_START = re.compile(r"(?:goo\.gle/debug\w*|SessionOptions:)\s*$")
_DUMP_LINE = re.compile(r"^(?:\s*\w+ \{|\s*\}|\s*\w+: \S.*|\s*)$")


def is_cpp_log_line(line: str) -> bool:
    """True for a line in the shape of TensorFlow's C++ logs (absl's, or TensorFlow 2.16's)."""
    return bool(_CPP_LINE.match(line))


class NoiseFilter:
    """Decides, line by line, whether one task's line is noise (the filter keeps the state that
    continuation lines need, so use one per task)."""

    def __init__(self):
        self._hid_last = False
        self._dump = False  # inside a multi-line dump announced by a hidden line

    def is_noise(self, line: str) -> bool:
        match = _CPP_LINE.match(line)
        dump = False
        if match:
            level = match.group("absl") or match.group("tf")
            noise = level == "I" or (level in "WE" and bool(_HARMLESS.search(line)))
            dump = noise and bool(_DUMP_START.search(line))
        elif _LINES.match(line):
            noise = True
        elif self._dump and _DUMP_LINE.match(line):
            noise = dump = True
        else:
            noise = self._hid_last and bool(_CONTINUATIONS.match(line))
        self._hid_last, self._dump = noise, dump
        return noise
