#!/bin/sh
# The coding agents the integration tests drive (tests/agents, tests/integration/test_agents.py):
# the newest Claude Code, Codex CLI and opencode from npm, installed into .agents/ in the checkout
# (git-ignored), never globally. Node and npm come from Debian's packages where the machine has
# none (scripts/system-deps.sh test). Run again to update them to npm's newest.
# Usage: scripts/agents.sh
set -eu
cd "$(dirname "$0")/.."
prefix=.agents
if ! command -v npm >/dev/null 2>&1; then
    echo "exod: npm is missing (Debian: apt-get install nodejs npm; scripts/system-deps.sh test)" >&2
    exit 1
fi
mkdir -p "$prefix"
# Claude Code's package asks for Node 22 (Debian 12 has 18): the native binary it installs
# needs no Node at all, so the engine check only warns. Its postinstall copies that binary in.
# opencode-ai likewise: its postinstall links the native binary of the platform's optional
# package (opencode-linux-x64, ...) in place of the launcher. Its provider for OpenAI-compatible
# APIs (@ai-sdk/openai-compatible) is built into that binary, so nothing else is needed.
npm install --prefix "$prefix" --no-audit --no-fund --no-update-notifier --loglevel=error \
    @anthropic-ai/claude-code@latest @openai/codex@latest opencode-ai@latest
for agent in claude codex opencode; do
    if ! version=$("$prefix/node_modules/.bin/$agent" --version 2>&1); then
        echo "exod: $prefix/node_modules/.bin/$agent does not run: $version" >&2
        exit 1
    fi
    echo "exod: $agent $version" >&2
done
