"""The development/test PostgreSQL gives the app role no way out of the database.

scripts/pg.sh's cluster: the role ``brooq`` that the app, the tests and the
benchmarks use is not a superuser (so it cannot run programs or read files as
the cluster's OS user); its socket is reachable by the cluster owner only;
nothing is trusted without a password. On another server (TEST_DATABASE_URL
set) the files are not ours to inspect, but the test role still must not be a
superuser: every test here runs either way, none is skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors

pytestmark = pytest.mark.db

# Predefined roles that reach the server's files or programs without superuser.
SERVER_ACCESS_ROLES = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")


def _connect(url: str) -> psycopg.Connection[Any]:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = "postgres"
    return psycopg.connect(
        psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}), autocommit=True
    )


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _is_pg_sh_cluster() -> bool:
    return not os.environ.get("TEST_DATABASE_URL")


def test_the_test_role_is_not_a_superuser(server_url: str) -> None:
    with _connect(server_url) as conn:
        assert _one(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is False
        for role in SERVER_ACCESS_ROLES:
            assert _one(conn, f"SELECT pg_has_role(current_user, '{role}', 'MEMBER')") is False, (
                f"the test role is a member of {role}"
            )


def test_the_test_role_cannot_run_programs_or_read_files_on_the_server(server_url: str) -> None:
    with _connect(server_url) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT pg_read_file('postgresql.conf')")


def test_the_local_cluster_admits_its_owner_by_socket_and_others_by_password(
    server_url: str, request: pytest.FixtureRequest
) -> None:
    if not _is_pg_sh_cluster():
        # Not pg.sh's cluster: its socket and pg_hba.conf are someone else's. What the test
        # role can show: it is no superuser, so the server's auth rules are hidden from it.
        with _connect(server_url) as conn, pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM pg_hba_file_rules")
        return
    admin_url: str = request.getfixturevalue("admin_url")
    with _connect(admin_url) as admin:
        assert _one(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is True
        port = int(_one(admin, "SHOW port"))
        assert _one(admin, "SHOW unix_socket_permissions") == "0700"
        folders = [d.strip() for d in str(_one(admin, "SHOW unix_socket_directories")).split(",")]
        rules = admin.execute(
            "SELECT line_number, type, user_name, auth_method, error FROM pg_hba_file_rules"
        ).fetchall()
        owner = _one(admin, "SELECT rolname FROM pg_roles WHERE oid = 10")
        app = psycopg.conninfo.conninfo_to_dict(server_url)["user"]
        assert (
            _one(admin, f"SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '{app}'")
            == app
        )
        # DROP DATABASE … WITH (FORCE) must be able to end an autovacuum worker in it.
        assert _one(admin, f"SELECT pg_has_role('{app}', 'pg_signal_backend', 'MEMBER')") is True
    for folder in folders:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, f"{folder} is not 0700"
        sock = Path(folder) / f".s.PGSQL.{port}"
        assert stat.S_IMODE(sock.stat().st_mode) == 0o700, f"{sock} is not 0700"
    assert rules and all(error is None for *_, error in rules), rules
    assert not [r for r in rules if r[3] == "trust"], f"trust lines in pg_hba.conf: {rules}"
    for _, kind, users, method, _ in rules:
        if kind == "local" and method == "peer":
            assert users == [owner], f"peer for {users}, not only the cluster owner {owner}"
        else:
            assert method == "scram-sha-256", f"{kind} {users} by {method}"
    # The bootstrap superuser has no password: not even the old pg.sh's one lets it in by TCP.
    params = psycopg.conninfo.conninfo_to_dict(server_url)
    params.update(user=owner, password="brooq", dbname="postgres")
    as_owner = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(as_owner).close()
