"""Where things are in the repository, for tests in any tier."""

import pathlib

HELPERS = pathlib.Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = HELPERS / "scripts"  # job scripts the cluster tests start
