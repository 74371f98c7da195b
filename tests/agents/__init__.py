"""Real agents against exod: how each is installed and configured (tests.agents.clients), a
loopback server that records what an agent sends (tests.agents.capture) and what the current
releases sent to it (captures/)."""
