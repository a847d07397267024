"""A job script written for a test, for the launcher tests with and without processes."""

import textwrap


def _script(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)
