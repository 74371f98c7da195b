"""What the daemon keeps of its keys' use: the append-only logs (`journal`: the usage log and
the audit log), the quotas' totals kept across restarts (`ledger`), and the one owner of it all
(`keeper`: the keys' gate, their totals for /metrics, the logs)."""
