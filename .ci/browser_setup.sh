#!/usr/bin/env bash
# Install what the HTML viewer's browser tests need: Debian chromium + chromium-driver, and the
# selenium Python driver in the project venv. Idempotent and non-fatal: when something cannot be
# installed, the browser tests skip with the reason printed.
# Usage (from the repo root): bash .ci/browser_setup.sh [PYTHON]   (PYTHON defaults to .venv/bin/python)
set -u
PY="${1:-.venv/bin/python}"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq || echo "browser_setup: apt-get update failed (continuing)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium chromium-driver \
      || echo "browser_setup: could not install chromium (browser tests will skip)"
  else
    echo "browser_setup: no apt-get; install chromium + chromium-driver by hand (browser tests will skip)"
  fi
fi
if ! "$PY" -c "import selenium" >/dev/null 2>&1; then
  "$PY" -m pip install -q "selenium>=4.20" || echo "browser_setup: could not install selenium (browser tests will skip)"
fi
command -v chromium >/dev/null 2>&1 && chromium --version 2>/dev/null | head -1
exit 0
