"""Helpers of test_docs.py's deployment tests: roles with the documented grants, a supervisor
run as such a role, and the documented pgbouncer.ini pointed at the test database."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from tests.integration.docs_blocks import SCRIPTS, Block, clean_env, psql
from tests.system.bouncer import PgBouncer

SUPERVISE = ["supervise", "--app", "myapp.jobs:queue", "--workers", "1"]


def as_role(url: str, user: str, password: str) -> str:
    """``url`` logging in as ``user``."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    info.update(user=user, password=password)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})


def run_sql(url: str, text: str) -> None:
    """``text`` through psql, stopping at the first error (AssertionError with it)."""
    done = subprocess.run(
        [psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr


def supervise_one_job(folder: Path, env: dict[str, str], owner: str) -> str:
    """Run ``brooq supervise`` until the one pending job is done and the supervisor has
    registered (read as ``owner``), then SIGTERM it; its log (AssertionError on a failure)."""
    path = folder / "supervise.log"
    with path.open("w") as log:
        sup = subprocess.Popen(
            [str(SCRIPTS / "brooq"), *SUPERVISE],
            cwd=folder,
            env={**env, "HTTP_ADDR": "127.0.0.1:0", "QUEUE_POLL_INTERVAL": "200ms"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            with psycopg.connect(owner, autocommit=True) as conn:
                while True:
                    done = conn.execute("SELECT count(*) FROM job WHERE state = 'done'").fetchone()
                    live = conn.execute("SELECT count(*) FROM brooq_supervisor").fetchone()
                    if done == (1,) and live == (1,):
                        break
                    assert sup.poll() is None, path.read_text()
                    assert time.monotonic() < deadline, "no job done and no registration in 30 s"
                    time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                sup.send_signal(signal.SIGTERM)
            code = sup.wait(30)
    text = path.read_text()
    assert code == 0, text
    return text


def documented_settings(block: Block) -> dict[str, str]:
    """The ``[pgbouncer]`` settings of the documented pgbouncer.ini."""
    section = block.text.split("[pgbouncer]")[1]
    return {k: v.strip() for k, v in re.findall(r"^(\w+) = ?(.*)$", section, flags=re.M)}


class DocumentedBouncer(PgBouncer):
    """The documented pgbouncer.ini, as written, but for where things are here: the test
    server and database, loopback, a free port, its own folder (and an admin user)."""

    def __init__(self, server_dsn: str, block: Block, dbname: str) -> None:
        super().__init__(server_dsn)
        self.block, self.dbname = block, dbname

    def config(self) -> str:
        text = re.sub(
            r"host=\S+ port=\d+ dbname=\S+",
            f"host={self.host} port={self.server_port} dbname={self.dbname}",
            self.block.text,
        )
        text = text.replace("listen_addr = 0.0.0.0", "listen_addr = 127.0.0.1")
        text = re.sub(r"(?m)^listen_port = \d+$", f"listen_port = {self.port}", text)
        text = re.sub(r"(?m)^auth_file = .*$", f"auth_file = {self.dir}/userlist.txt", text)
        return text + (
            f"admin_users = {self.user}\nunix_socket_dir =\n"
            f"logfile = {self.dir}/pgbouncer.log\npidfile = {self.dir}/pgbouncer.pid\n"
        )

    def in_force(self) -> dict[str, str]:
        """``SHOW CONFIG``: every setting as the running bouncer has it."""
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("SHOW CONFIG")
            return {str(row[0]): str(row[1]) for row in cur.fetchall()}
