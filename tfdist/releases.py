"""The releases tfdist supports: the tested TensorFlow / Keras / tf_keras matrix, in one place.

The matrix below is what `make test-matrix` runs (noxfile.py reads it), what `tfdist env` and
`tfdist doctor` compare the installed releases with, and what the README's compatibility table
shows. A release newer than the matrix still works where the fixes' targets still match: tfdist
warns once that it is untested, and `tfdist doctor` runs the scenarios that matter.

Nothing here imports TensorFlow. A leaf: imports no other tfdist module.
"""

from __future__ import annotations

import dataclasses
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
    """One tested set of releases: TensorFlow, Keras 3, and tf_keras of the same TF minor."""

    tensorflow: str
    keras: str
    tf_keras: str

    @property
    def name(self) -> str:
        return f"tf{self.tensorflow}-keras{self.keras}"

    def pins(self) -> list:
        """pip requirements that install exactly this set."""
        return [f"tensorflow=={self.tensorflow}", f"keras=={self.keras}",
                f"tf-keras=={self.tf_keras}"]  # fmt: skip


# The tested matrix: oldest first; the last pair is the newest Keras on the oldest TensorFlow.
MATRIX = (
    Release("2.16.2", "3.3.3", "2.16.0"),
    Release("2.17.1", "3.5.0", "2.17.0"),
    Release("2.18.1", "3.8.0", "2.18.0"),
    Release("2.19.1", "3.10.0", "2.19.0"),
    Release("2.20.0", "3.11.3", "2.20.1"),
    Release("2.21.0", "3.15.1", "2.21.0"),
    Release("2.16.2", "3.15.1", "2.16.0"),
)
OLDEST, NEWEST = MATRIX[0], MATRIX[-2]

TENSORFLOW_RANGE = (parse_version("2.16")[:2], parse_version("2.21")[:2])
KERAS_RANGE = (parse_version("3.3")[:2], parse_version("3.15")[:2])
TF_KERAS_RANGE = TENSORFLOW_RANGE  # tf_keras follows TensorFlow's minor versions

TESTED, IN_RANGE, NEWER, OLDER = "tested", "in range", "newer", "older"


@dataclasses.dataclass(frozen=True)
class Support:
    """How the installed releases relate to the matrix.

    status: "tested" (this TensorFlow and Keras minor pair is in the matrix), "in range"
    (each within the tested range, the pair itself not run), "newer" (a release newer than the
    matrix: fixes whose targets still match are applied), or "older" (not supported).
    """

    status: str
    message: str

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
        )
    if tf_v > TENSORFLOW_RANGE[1] or keras_v > keras_range[1]:
        return Support(
            NEWER,
            f"{here} is newer than the releases tfdist was tested with ({tested_range}). "
            "Fixes whose targets still match are applied; `tfdist doctor` runs the scenarios "
            "that matter on this machine. Report what fails as an issue.",
        )
    if (tf_v, keras_v) in pairs:
        return Support(TESTED, f"{here}: a tested pair.")
    return Support(IN_RANGE, f"{here}: within the tested range ({tested_range}).")


_WARNED = []


def warn_if_untested(tensorflow: str, keras: str, flavour: str = "keras3") -> Support:
    """Warns once per process when these releases are newer or older than MATRIX."""
    here = support(tensorflow, keras, flavour)
    if here.status in (NEWER, OLDER) and not _WARNED:
        _WARNED.append(here)
        warnings.warn(here.message, CompatibilityWarning, stacklevel=3)
    return here
