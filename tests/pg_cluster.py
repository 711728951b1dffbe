"""A private PostgreSQL cluster for tests: initdb in a temporary directory, a free loopback port,
no socket outside that directory, stopped and deleted by `stop()`.

    cluster = PgCluster.start()      # or None when PostgreSQL is not installed: why_missing() says why
    cluster.url                      # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
    cluster.stop()

Run as root (CI containers), the server runs as the `postgres` OS user (PostgreSQL refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def why_missing() -> str | None:
    """None when a cluster can be started here, else why not (one line)."""
    if bin_dir() is None:
        return "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver psycopg is not installed (pip install -e '.[test]')"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` OS user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgCluster:
    root: Path
    port: int
    bin: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls) -> PgCluster:
        pg = bin_dir()
        assert pg is not None, why_missing()
        root = Path(tempfile.mkdtemp(prefix="autoao-pg-"))
        os.chmod(root, 0o755)
        data = root / "data"
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
        run = lambda *cmd: subprocess.run([*as_user, *cmd], check=True, capture_output=True, cwd=root)  # noqa: E731
        run(str(pg / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        port = _free_port()
        # loopback only, the unix socket inside the temporary directory; fsync off: a test cluster
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        run(str(pg / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "server.log"), "-w", "-t", "60", "start")
        return cls(root, port, pg)

    def stop(self) -> None:
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_user, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                        "-w", "stop"], capture_output=True, cwd=self.root)
        shutil.rmtree(self.root, ignore_errors=True)
