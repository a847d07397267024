"""What the in-process and the subprocess tests of the `tfdist` command share: a cluster and
the parser of `tf-config --format export` output."""

import json
import shlex

from tfdist.cluster import ClusterSpec


def _parse_export(stdout):
    """`# task` / `export TF_CONFIG='...'` lines -> [(comment or None, TF_CONFIG dict)]."""
    entries, comment = [], None
    for line in stdout.splitlines():
        if line.startswith("#"):
            comment = line[1:].strip()
            continue
        words = shlex.split(line)
        assert len(words) == 2 and words[0] == "export", line
        name, _, value = words[1].partition("=")
        assert name == "TF_CONFIG", line
        entries.append((comment, json.loads(value)))
        comment = None
    return entries


SPEC = ClusterSpec.from_hosts(workers=["h1:2222", "h2:2222"], ps=["h3:2222"], chief="h0:2222")
