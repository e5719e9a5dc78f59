#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need first.
#  - Chromium and ChromeDriver (Debian packages) for the web app's end-to-end tests;
#  - the default model (all-MiniLM-L6-v2) is fetched into the cache by attnscope itself on first use.
# The reference files the tests compare against are in tests/data (scripts/make_test_data.py).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "installing chromium and chromium-driver (needed by the web app's browser tests)" >&2
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# The browser tests start $CHROME_BIN, else /usr/bin/chromium: name the one on PATH.
if [ -z "${CHROME_BIN:-}" ]; then
    CHROME_BIN=$(command -v chromium)
    export CHROME_BIN
fi

cargo test --workspace --no-fail-fast "$@"

# The Python package (bindings/python): built and installed into a fresh virtual environment
# with what its tests need, then its pytest suite. Its tests call the debug binary built above.
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check numpy torch pytest
"$venv/bin/pip" install -q --disable-pip-version-check ./bindings/python
ATTNSCOPE_BIN="$PWD/target/debug/attnscope" "$venv/bin/python" -m pytest -q bindings/python/tests
