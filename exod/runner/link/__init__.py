"""The runner's side of its link to the daemon: the channel (`channel`), how it learns to stop
(`lifecycle`), its reports (`report`) and its log lines (`log`)."""
