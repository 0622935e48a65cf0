#!/usr/bin/env bash
# Installs Debian's `chromium` when it is missing: the dashboard's browser tests (tests/serve_browser.rs)
# drive it headless through playwright-core (installed by scripts/install-test-deps.sh). Needs apt-get
# and root (or sudo); does nothing when /usr/bin/chromium is there already.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version
