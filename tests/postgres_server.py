"""A throwaway PostgreSQL server for the tests (Debian's ``postgresql`` package): ``initdb`` in a folder,
``pg_ctl start`` on a free local port, trust authentication on 127.0.0.1 only, stopped at the end.

    eval "$(python tests/postgres_server.py start /tmp/pg)"   # exports WB_TEST_POSTGRES_URI, WB_TEST_POSTGRES_DATA
    python tests/postgres_server.py stop /tmp/pg

``.ci/run`` starts one for the whole run; without ``WB_TEST_POSTGRES_URI`` the tests' fixture
(tests/test_postgres.py) starts its own. PostgreSQL refuses to run as root, so as root the server runs
as the package's ``postgres`` user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

USER = "wb"  # the database superuser initdb creates (trust auth, local only)


def bin_dir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's /usr/lib/postgresql/N/bin (newest)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_ctl(folder: Path, *args: str) -> None:
    """``pg_ctl -D folder/data ARGS`` as the server's user; raises CalledProcessError with its log."""
    b = bin_dir()
    cmd = _as_server_user([str(b / "pg_ctl"), "-D", str(folder / "data"), "-l", str(folder / "server.log"), *args])
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def start(folder: Path) -> str:
    """Initialise and start a server in ``folder``; returns its URI ``postgresql://wb@127.0.0.1:PORT/postgres``.

    Raises:
        FileNotFoundError: no PostgreSQL binaries (``apt-get install postgresql``).
    """
    b = bin_dir()
    if b is None:
        raise FileNotFoundError("no initdb: apt-get install postgresql")
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    subprocess.run(
        _as_server_user([str(b / "initdb"), "-D", str(folder / "data"), "-U", USER, "--auth=trust", "-E", "UTF8"]),
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = _free_port()
    conf = f"\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{folder}'\nfsync = off\n"
    with open(folder / "data" / "postgresql.conf", "a") as f:
        f.write(conf)  # fsync off: a throwaway server, writes need not survive a power cut
    pg_ctl(folder, "-w", "-t", "60", "start")
    (folder / "uri").write_text(f"postgresql://{USER}@127.0.0.1:{port}/postgres")
    return (folder / "uri").read_text()


def stop(folder: Path) -> None:
    if (folder / "data" / "postmaster.pid").exists():
        pg_ctl(folder, "-w", "-m", "fast", "stop")


def create_database(uri: str, name: str) -> str:
    """A new empty database ``name`` on the server at ``uri``; returns its URI."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return uri.rsplit("/", 1)[0] + "/" + name


def wait_ready(uri: str, timeout: float = 60.0) -> None:
    """Until the server at ``uri`` accepts connections (after a restart)."""
    import psycopg

    end = time.time() + timeout
    while True:
        try:
            psycopg.connect(uri).close()
            return
        except psycopg.OperationalError:
            if time.time() > end:
                raise
            time.sleep(0.3)


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2]).resolve()
    if what == "start":
        uri = start(where)
        print(f"export WB_TEST_POSTGRES_URI={uri} WB_TEST_POSTGRES_DATA={where}")
    else:
        stop(where)
