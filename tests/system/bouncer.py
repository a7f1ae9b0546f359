"""A real PgBouncer (Debian's package) in transaction mode in front of the test PostgreSQL.

``PgBouncer.start()`` installs the package when it is missing (``apt-get
install -y pgbouncer``; the tests run as root), writes its configuration and
auth file into a fresh folder, starts it on a free port (as ``postgres`` when
we are root: PgBouncer refuses to run as root) and waits until it answers.
``pools()`` reads ``SHOW POOLS`` on its admin console; ``stop()`` ends it.
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import ClientCursor

from tests.system.harness import free_port, wait_until

INSTALL_TIMEOUT_S = 300


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, installing Debian's package when we may; None if impossible."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "pgbouncer"]
    done = subprocess.run(install, env=env, capture_output=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:  # the package lists may be missing in a fresh container
        subprocess.run(
            ["apt-get", "update", "-q"], env=env, capture_output=True, timeout=INSTALL_TIMEOUT_S
        )
        subprocess.run(install, env=env, capture_output=True, timeout=INSTALL_TIMEOUT_S)
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )


class PgBouncer:
    """One pgbouncer process; ``url(dsn)`` is ``dsn`` pointed at it."""

    def __init__(self, server_dsn: str, pool_size: int = 8, max_clients: int = 400) -> None:
        info = psycopg.conninfo.conninfo_to_dict(server_dsn)
        self.host, self.server_port = str(info.get("host", "127.0.0.1")), int(info["port"] or 5432)
        self.user, self.password = str(info["user"]), str(info["password"])
        self.pool_size, self.max_clients = pool_size, max_clients
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="brooq-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        """pgbouncer.ini: transaction pooling, every database, one server pool cap for all."""
        return f"""[databases]
* = host={self.host} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = plain
auth_file = {self.dir}/userlist.txt
admin_users = {self.user}
stats_users = {self.user}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_db_connections = {self.pool_size}
max_client_conn = {self.max_clients}
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
"""

    def start(self) -> PgBouncer:
        binary = pgbouncer_binary()
        if binary is None:
            pytest.skip("pgbouncer is not installed and cannot be (not root, or no apt-get)")
        (self.dir / "pgbouncer.ini").write_text(self.config())
        (self.dir / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        command = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            for path in self.dir.iterdir():
                shutil.chown(path, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, 10, "pgbouncer to answer")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {self.log_tail()}")
        try:
            self.pools()
        except psycopg.Error:
            return False
        return True

    def url(self, dsn: str) -> str:
        """``dsn`` (a database of the test server) through the bouncer."""
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{info['dbname']}"

    def admin(self) -> psycopg.Connection[Any]:
        """The admin console (simple query protocol only: a ClientCursor)."""
        return psycopg.connect(
            self.url("postgresql://x@h:1/pgbouncer"),
            autocommit=True,
            cursor_factory=ClientCursor,
            connect_timeout=3,
        )

    def pools(self) -> list[dict[str, Any]]:
        """SHOW POOLS, one dict per (database, user) pool."""
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("SHOW POOLS")
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def server_connections(self, dbname: str | None = None) -> int:
        """Server connections the bouncer holds now (active, idle, used, tested, login)."""
        total = 0
        for pool in self.pools():
            if pool["database"] == "pgbouncer" or (dbname and pool["database"] != dbname):
                continue
            total += sum(
                int(pool.get(k) or 0)
                for k in (
                    "sv_active",
                    "sv_idle",
                    "sv_used",
                    "sv_tested",
                    "sv_login",
                    "sv_active_cancel",
                    "sv_being_canceled",
                )
            )
        return total

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.dir / "pgbouncer.log").read_text().splitlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
        time.sleep(0)
