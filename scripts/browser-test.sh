#!/usr/bin/env bash
# Runs the explorer's browser tests (`attnscope html` files and the `attnscope serve` app in
# headless Chromium, driven through chromedriver) and keeps their screenshots to look at.
# Usage: scripts/browser-test.sh [DIR]   (default DIR: target/browser-screenshots)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/browser-screenshots}"
mkdir -p "$dir"
ATTNSCOPE_SCREENSHOTS="$(cd "$dir" && pwd)" cargo test -p attnscope --test cli_html --test serve_e2e
echo "screenshots: $dir"
ls "$dir"
