"""What exod knows about its service managers' files: reading systemd units and launchd plists
(for `exod check`), and installing them (`exod install`). No daemon code depends on this."""
