"""The releases tfdist supports: the tested TensorFlow / Keras / tf_keras matrix, in one place.

The matrix below is what `make test-matrix` runs (noxfile.py reads it), what `tfdist env` and
`tfdist doctor` compare the installed releases with, and what the README's compatibility table
shows. `NEXT_RELEASE` is the Keras release after the matrix, tested before it is out on a named
keras-nightly build (`make test-next`). A release newer than both still works where the fixes'
targets still match: tfdist warns once that it is untested, and `tfdist doctor` runs the
scenarios that matter.

Nothing here imports TensorFlow. A leaf: imports no other tfdist module.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Tuple

Version = Tuple[int, ...]


class CompatibilityWarning(UserWarning):
    """A release tfdist was not tested with, or a fix skipped because its target changed."""


def parse_version(text: str) -> Version:
    """ "3.10.0" -> (3, 10, 0); "2.21.0rc1" -> (2, 21, 0); missing parts are 0."""
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def _text(version: Version) -> str:
    return ".".join(map(str, version))


@dataclasses.dataclass(frozen=True)
class Release:
    """One tested set of releases: TensorFlow, Keras 3, and tf_keras of the same TF minor.

    Attributes:
        tensorflow: str. The TensorFlow release.
        keras: str. The Keras 3 release.
        tf_keras: str. The tf_keras release of that TensorFlow minor.
        python: str. The Python versions the three together install on, "3.9-3.12": the
            narrowest of TensorFlow's wheels (cp39 to cp312 for 2.16) and the Requires-Python
            of Keras and tf_keras (Keras 3.15: >=3.11).
    """

    tensorflow: str
    keras: str
    tf_keras: str
    python: str = ""

    @property
    def python_range(self) -> Tuple[Version, Version]:
        """The oldest and newest Python minor of `python`: "3.9-3.12" -> ((3, 9), (3, 12))."""
        oldest, _, newest = self.python.partition("-")
        return parse_version(oldest)[:2], parse_version(newest or oldest)[:2]

    @property
    def name(self) -> str:
        return f"tf{self.tensorflow}-keras{self.keras}"

    def pins(self) -> list:
        """pip requirements that install exactly this set."""
        return [f"tensorflow=={self.tensorflow}", f"keras=={self.keras}",
                f"tf-keras=={self.tf_keras}"]  # fmt: skip


# The tested matrix: oldest first; the last pair is the newest Keras on the oldest TensorFlow.
# Python: TensorFlow ships wheels for 3.9-3.12 (2.16-2.19), 3.9-3.13 (2.20), 3.10-3.13 (2.21);
# Keras requires >=3.9 up to 3.10, >=3.10 from 3.11, >=3.11 from 3.15; tf_keras 2.21 >=3.10.
MATRIX = (
    Release("2.16.2", "3.3.3", "2.16.0", "3.9-3.12"),
    Release("2.17.1", "3.5.0", "2.17.0", "3.9-3.12"),
    Release("2.18.1", "3.8.0", "2.18.0", "3.9-3.12"),
    Release("2.19.1", "3.10.0", "2.19.0", "3.9-3.12"),
    Release("2.20.0", "3.11.3", "2.20.1", "3.10-3.13"),
    Release("2.21.0", "3.15.1", "2.21.0", "3.11-3.13"),
    Release("2.16.2", "3.15.1", "2.16.0", "3.11-3.12"),
)
OLDEST, NEWEST = MATRIX[0], MATRIX[-2]

# The oldest Python tfdist serves: the oldest that a pair of the matrix installs on
# (setup.cfg's python_requires says the same; `import tfdist` refuses an older one).
PYTHON_FLOOR = min(r.python_range[0] for r in MATRIX)


def check_python(version_info=None) -> None:
    """Refuses a Python older than every pair of the matrix installs on.

    `import tfdist` calls it first. pip does not install tfdist there (python_requires), but a
    checkout on the path, or a virtualenv made with another Python, would otherwise fail later
    and less clearly.

    Args:
        version_info: the running Python's `sys.version_info` (the default), or a tuple.

    Raises:
        ImportError: when `version_info` is older than PYTHON_FLOOR; the message names the
            running Python and the versions to use.
    """
    running = tuple(sys.version_info if version_info is None else version_info)[:3]
    if running[:2] >= PYTHON_FLOOR:
        return
    newest = NEWEST.python_range
    raise ImportError(
        f"tfdist needs Python {_text(PYTHON_FLOOR)} or newer: TensorFlow "
        f"{_text(parse_version(OLDEST.tensorflow)[:2])}, the oldest release it supports, "
        f"ships for Python {OLDEST.python}. Received: Python {_text(running)} "
        f"({sys.executable}). HINT: make the virtualenv with a newer Python, e.g. "
        f"`python3.{newest[0][1]} -m venv .venv`; the newest pair (TensorFlow "
        f"{NEWEST.tensorflow}, Keras {NEWEST.keras}) needs Python {NEWEST.python}."
    )


@dataclasses.dataclass(frozen=True)
class NextRelease:
    """The Keras release after the matrix, tested before it is out on a keras-nightly build.

    keras-nightly installs as the `keras` package; its version names the release it becomes
    and the hour it was built ("3.16.0.dev2026102704": Keras 3.16, 2026-10-27).

    Attributes:
        nightly: str. The keras-nightly build the README's scenarios were run on.
        tensorflow: str. The TensorFlow release they were run with (the matrix's newest).
        tf_keras: str. The tf_keras of that TensorFlow.
        tf_nightly: str. The tf-nightly-cpu build they were also run with ("": none).
        tf_keras_nightly: str. The tf-keras-nightly build of that TensorFlow.
    """

    nightly: str
    tensorflow: str
    tf_keras: str
    tf_nightly: str = ""
    tf_keras_nightly: str = ""

    @property
    def keras(self) -> str:
        """The release the nightly becomes, e.g. "3.16"."""
        return _text(parse_version(self.nightly)[:2])

    @property
    def built(self) -> str:
        """The nightly's build date, "YYYY-MM-DD" (from its version)."""
        stamp = self.nightly.rpartition(".dev")[2]
        return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}"

    @property
    def name(self) -> str:
        return f"next-tf{self.tensorflow}-keras{self.nightly}"

    def pins(self) -> list:
        """uv/pip requirements of this TensorFlow with the keras-nightly build.

        keras-nightly writes the package `keras` that TensorFlow requires by the release's
        name: install these without that requirement (noxfile.py drops it with an override).
        """
        return [f"tensorflow=={self.tensorflow}", f"keras-nightly=={self.nightly}",
                f"tf-keras=={self.tf_keras}"]  # fmt: skip


# The next Keras: the keras-nightly build whose scenarios all passed (`make test-next`), on the
# newest TensorFlow of the matrix and on tf-nightly.
NEXT_RELEASE = NextRelease(
    "3.16.0.dev2026102704", "2.21.0", "2.21.0", "2.22.0.dev20260905", "2.22.0.dev2026101709"
)

TENSORFLOW_RANGE = (parse_version("2.16")[:2], parse_version("2.21")[:2])
KERAS_RANGE = (parse_version("3.3")[:2], parse_version("3.15")[:2])
TF_KERAS_RANGE = TENSORFLOW_RANGE  # tf_keras follows TensorFlow's minor versions

TESTED, IN_RANGE, NEXT, NEWER, OLDER = "tested", "in range", "next", "newer", "older"


@dataclasses.dataclass(frozen=True)
class Support:
    """How the installed releases relate to the matrix.

    status: "tested" (this TensorFlow and Keras minor pair is in the matrix), "in range"
    (each within the tested range, the pair itself not run), "next" (the Keras release after
    the matrix, whose nightly build NEXT_RELEASE names was tested), "newer" (a release newer
    than the matrix: fixes whose targets still match are applied), or "older" (not supported).
    warn: bool. Whether tfdist warns once that these releases were not tested: "newer",
    "older", and a build of the next Keras other than the nightly tested.
    """

    status: str
    message: str
    warn: bool = False

    @property
    def supported(self) -> bool:
        return self.status in (TESTED, IN_RANGE)


def support(tensorflow: str, keras: str, flavour: str = "keras3") -> Support:
    """Compares TensorFlow / Keras versions (the Keras in use: Keras 3 or tf_keras) with MATRIX."""
    tf_v, keras_v = parse_version(tensorflow)[:2], parse_version(keras)[:2]
    legacy = flavour == "tf_keras"
    keras_range = TF_KERAS_RANGE if legacy else KERAS_RANGE
    label = "tf_keras" if legacy else "Keras"
    pairs = {
        (parse_version(r.tensorflow)[:2], parse_version(r.tf_keras if legacy else r.keras)[:2])
        for r in MATRIX
    }
    here = f"TensorFlow {tensorflow} with {label} {keras}"
    tested_range = (
        f"TensorFlow {_text(TENSORFLOW_RANGE[0])}-{_text(TENSORFLOW_RANGE[1])}, "
        f"{label} {_text(keras_range[0])}-{_text(keras_range[1])}"
    )
    if tf_v < TENSORFLOW_RANGE[0] or keras_v < keras_range[0]:
        return Support(
            OLDER,
            f"{here} is older than tfdist supports ({tested_range}). HINT: pip install -U "
            f"'tensorflow>={_text(TENSORFLOW_RANGE[0])}' 'keras>={_text(KERAS_RANGE[0])}'.",
            warn=True,
        )
    if not legacy and _is_next(tf_v, keras_v):
        return _next_support(here, tensorflow, keras)
    if tf_v > TENSORFLOW_RANGE[1] or keras_v > keras_range[1]:
        return Support(
            NEWER,
            f"{here} is newer than the releases tfdist was tested with ({tested_range}). "
            "Fixes whose targets still match are applied; `tfdist doctor` runs the scenarios "
            "that matter on this machine. Report what fails as an issue.",
            warn=True,
        )
    if (tf_v, keras_v) in pairs:
        return Support(TESTED, f"{here}: a tested pair.")
    return Support(IN_RANGE, f"{here}: within the tested range ({tested_range}).")


def _is_next(tf_v: Version, keras_v: Version) -> bool:
    """The next Keras on a TensorFlow it was run with (a release, or tf-nightly's)."""
    tensorflows = {parse_version(NEXT_RELEASE.tensorflow)[:2]}
    if NEXT_RELEASE.tf_nightly:
        tensorflows.add(parse_version(NEXT_RELEASE.tf_nightly)[:2])
    return keras_v == parse_version(NEXT_RELEASE.keras)[:2] and tf_v in tensorflows


def _next_support(here: str, tensorflow: str, keras: str) -> Support:
    tested = f"keras-nightly {NEXT_RELEASE.nightly} (built {NEXT_RELEASE.built})"
    tensorflows = (parse_version(NEXT_RELEASE.tensorflow)[:2], NEXT_RELEASE.tf_nightly)
    if keras == NEXT_RELEASE.nightly and (
        parse_version(tensorflow)[:2] == tensorflows[0] or tensorflow == tensorflows[1]
    ):
        return Support(
            NEXT,
            f"{here}: the next Keras ({NEXT_RELEASE.keras}), tested before its release on this "
            f"build, {tested}.",
        )
    return Support(
        NEXT,
        f"{here}: the next Keras ({NEXT_RELEASE.keras}), tested before its release on {tested}, "
        "not on this pair. "
        "Fixes whose targets still match are applied; `tfdist doctor` runs the scenarios that "
        "matter on this machine. Report what fails as an issue.",
        warn=True,
    )


_WARNED = []


def warn_if_untested(tensorflow: str, keras: str, flavour: str = "keras3") -> Support:
    """Warns once per process when these releases were not tested (`Support.warn`)."""
    here = support(tensorflow, keras, flavour)
    if here.warn and not _WARNED:
        _WARNED.append(here)
        warnings.warn(here.message, CompatibilityWarning, stacklevel=3)
    return here
