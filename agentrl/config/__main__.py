"""``python -m agentrl.config``: every config key with its default and docstring; ``--write-doc PATH``
regenerates the reference part of docs/configuration.md."""

import sys

from agentrl.config import describe_config, write_doc

if sys.argv[1:2] == ["--write-doc"] and len(sys.argv) == 3:
    write_doc(sys.argv[2])
else:
    print(describe_config())
