"""`onceflow worker` flags for the common settings: flag -> (settings field, metavar).

A module of its own, free of heavy imports: the CLI builds its parser for every command,
and a replay must not pay for importing the settings (pydantic) to do so.
"""

from __future__ import annotations

WORKER_FLAGS = {"--broker": ("broker_url", "URL"), "--data-dir": ("data_dir", "DIR"),
                "--web-port": ("web_port", "PORT"), "--partitions": ("partitions", "N"),
                "--log-level": ("log_level", "LEVEL")}
