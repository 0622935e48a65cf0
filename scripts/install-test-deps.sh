#!/usr/bin/env bash
# Installs what the MCP and dashboard tests run against, pinned in tests/npm/package-lock.json: the reference
# server `@modelcontextprotocol/server-everything`, the MCP Inspector (its command-line mode drives
# `archon mcp serve`) and playwright-core (which drives Chromium for tests/serve_browser.rs). Needs Node.js
# and npm; the tests look for tests/npm/node_modules.
set -euo pipefail
cd "$(dirname "$0")/../tests/npm"
npm ci --no-audit --no-fund --ignore-scripts
