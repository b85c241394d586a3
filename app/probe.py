"""`python -m onceflow.app.probe [PATH]`: the container's health check.

It asks this worker's own web server (the port of ONCEFLOW_WEB_PORT, on the address it
listens on, or loopback when it listens on every address) for PATH (default /livez) and
exits 0 on a 200 answer, 1 otherwise, with one line saying what it got.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from onceflow.errors import OnceflowError

from .settings import WILDCARDS, WorkerSettings

TIMEOUT = 4.0


def probe_url(settings: WorkerSettings, path: str) -> str:
    """The URL of PATH on this machine's worker."""
    host = settings.bind_host
    if host in WILDCARDS:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.web_port}/{path.lstrip('/')}"


def probe(path: str) -> int:
    """0 when the worker answers 200, 1 otherwise."""
    try:
        url = probe_url(WorkerSettings.from_env(), path)
    except OnceflowError as exc:
        print(f"onceflow probe: {exc}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"onceflow probe: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"onceflow probe: {url}: {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(probe(sys.argv[1] if len(sys.argv) > 1 else "/livez"))
