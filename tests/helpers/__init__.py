"""What several test files share: environments, configs, fixtures, launch scripts and paths.

Test files import from here (``from tests.helpers.configs import small_config``), never from each
other; the scripts here that run in their own process (``sharded_update.py`` under torchrun,
``mcp_server.py`` over stdio) are started by path (``HELPERS / "sharded_update.py"``)."""

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
ROOT = HELPERS.parents[1]
"""The repository's root."""
DATA = ROOT / "tests" / "data"
