"""Pure logic, no I/O and no mlx: states, the termination ladder, restarts, shards, exit codes,
ports, memory, serving defaults and the rules a request must pass (request_rules).
"""
