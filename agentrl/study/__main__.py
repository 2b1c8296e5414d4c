"""``python -m agentrl.study PAYLOAD``: one study run in a child process (``agentrl.study.run_study`` starts it)."""

import sys

from agentrl.study.runs import child_main

raise SystemExit(child_main(sys.argv[1]))
