"""pyspark's Python worker daemon, importing pyspark from the installed package.

Spark puts pyspark's source zip (`pyspark/python/lib/pyspark.zip`) first on the path of
the Python workers it starts.  Python keeps no bytecode for modules it imports from a zip:
the daemon and every worker it forks compiled pyspark's modules again on each run (about
half a second of CPU each on local[2], before the first task could start).  With a pip
install the zip sits inside the installed package and holds the same files, so this
daemon takes it off the path and the daemon and its workers import the installed,
compiled modules.  Anything else (a SPARK_HOME distribution) is left as Spark set it.

Local sessions use it through `spark.python.daemon.module` (`session.py`).
"""

from __future__ import annotations

import os
import sys


def installed_zips(path: list[str]) -> list[str]:
    """The zips on `path` that lie inside a pyspark package also importable from `path`."""
    packages = [os.path.realpath(os.path.join(entry, "pyspark")) for entry in path
                if entry and not entry.endswith(".zip")
                and os.path.isfile(os.path.join(entry, "pyspark", "__init__.py"))]
    return [entry for entry in path if entry.endswith(".zip") and any(
        os.path.realpath(entry).startswith(package + os.sep) for package in packages)]


def main() -> None:
    """Run pyspark's daemon with the installed pyspark first."""
    drop = set(installed_zips(sys.path))
    sys.path[:] = [entry for entry in sys.path if entry not in drop]
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
