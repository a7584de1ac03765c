"""trainsup under systemd: its unit files checked by ``systemd-analyze verify``, ``trainsup service``,
and real runs under a throw-away systemd (``../shared/tools/systemd-sandbox``; root only)."""
