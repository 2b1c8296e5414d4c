#!/usr/bin/env bash
# The verifiers adapter's tests in their own virtual environment (.venv-verifiers): verifiers 0.4.0
# pins mcp==2.0.0 and openai<3, which cannot share .venv with agentrl's mcp>=2.3. The environment is
# layered on .venv (a .pth line adds .venv's site-packages after its own), so it holds only verifiers
# and its pins; everything else, agentrl included, is .venv's. Idempotent: the install runs once
# (marker file), later calls only run the tests. Exits 0 with a printed reason when verifiers cannot
# be installed or imported here, so a machine without it does not fail CI.
#
#   bash scripts/test_verifiers.sh            # install if needed, then pytest -m verifiers
#   bash scripts/test_verifiers.sh --install  # install only
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-verifiers
# with its openenv extra: verifiers' own openenv taskset is written against the `openenv` package
# (>=0.4.1), which shadows .venv's openenv-core 0.3.0 here (same import name)
SPEC="${AGENTRL_VERIFIERS_SPEC:-verifiers[openenv]==0.4.0}"
skip() { echo "SKIPPED verifiers tests: $*"; exit 0; }

if [ ! -f "$VENV/.agentrl-ready-3" ]; then
  base=$(.venv/bin/python -c "import sys; print(sys._base_executable)") || skip "no .venv (run scripts/setup.sh)"
  main_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ -x "$VENV/bin/python" ] || "$base" -m venv "$VENV" || skip "cannot create $VENV"
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # addsitedir also reads .venv's own .pth files (agentrl's editable install is one)
  echo "import site; site.addsitedir('$main_site')" > "$site/zz_agentrl_main_venv.pth"
  "$VENV/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$SPEC" 2>&1 \
    | grep -v "outside environment\|dependency resolver\|requires .*, but you have\|^WARNING: Location" || true
  "$VENV/bin/python" -c "import verifiers.v1, agentrl.agents" || skip "verifiers or agentrl does not import in $VENV"
  # agentrl's command in this environment (pip writes no entry points for .venv's packages here)
  printf '#!/bin/sh\nexec "%s/bin/python" -m agentrl.cli "$@"\n' "$(cd "$VENV" && pwd)" > "$VENV/bin/agentrl"
  chmod +x "$VENV/bin/agentrl"
  touch "$VENV/.agentrl-ready-3"
fi
[ "${1:-}" = "--install" ] && { echo "$VENV ready"; exit 0; }
exec "$VENV/bin/python" -m pytest -m verifiers -q tests/environments/test_verifiers.py "$@"
