"""What a named key may use and what it used: its per-minute token buckets (`bucket`), its
quotas by UTC calendar day and month (`calendar`), its load of the last minutes (`recent`),
the one check of a request against them (`gate`), a finished request's record (`record`) and
the sums `exoctl usage` prints (`summary`). Pure: every clock is an argument."""
