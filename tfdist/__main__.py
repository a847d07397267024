"""`python -m tfdist ...`, the same as the `tfdist` command."""

import sys

from tfdist.cli import main

if __name__ == "__main__":
    sys.exit(main())
