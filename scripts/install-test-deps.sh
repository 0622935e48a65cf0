#!/usr/bin/env bash
# Installs what the MCP tests run against, pinned in tests/npm/package-lock.json: the reference server
# `@modelcontextprotocol/server-everything` and the MCP Inspector (its command-line mode drives
# `archon mcp serve`). Needs Node.js and npm; the tests look for tests/npm/node_modules/.bin.
set -euo pipefail
cd "$(dirname "$0")/../tests/npm"
npm ci --no-audit --no-fund --ignore-scripts
