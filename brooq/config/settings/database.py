"""Settings of the database connections: where, and through what (PgBouncer, LISTEN)."""

from __future__ import annotations

from brooq.config import values as v
from brooq.config.settings.key import Key, KeyTable


class DatabaseKeys(KeyTable):
    """DATABASE_URL, QUEUE_LISTEN_URL and QUEUE_PGBOUNCER."""

    database_url: Key[str | None] = Key(
        "DATABASE_URL",
        v.DSN,
        None,
        "PostgreSQL URL or libpq key=value string (secret: its password is never logged).",
        section="secrets",
        example="postgresql://user@localhost:5432/app",
        secret=True,
    )
    listen_url: Key[str | None] = Key(
        "QUEUE_LISTEN_URL",
        v.DSN,
        None,
        "Direct PostgreSQL URL for LISTEN (a session of its own), for when DATABASE_URL goes "
        "through a transaction-pooling PgBouncer. Empty: LISTEN on DATABASE_URL, or with "
        "QUEUE_PGBOUNCER no LISTEN at all (look for jobs every QUEUE_POLL_INTERVAL).",
        section="secrets",
        example="postgresql://user@db-host:5432/app",
        secret=True,
    )
    pgbouncer: Key[bool] = Key(
        "QUEUE_PGBOUNCER",
        v.BOOL,
        "false",
        "DATABASE_URL goes through PgBouncer in transaction mode: no server-side prepared "
        "statements, no session settings (statement_timeout by SET LOCAL), no LISTEN but on "
        "QUEUE_LISTEN_URL (true/false).",
        section="connections",
    )

    def listen_dsn(self, dsn: str) -> str | None:
        """Where LISTEN connects: QUEUE_LISTEN_URL, else ``dsn`` unless it is a bouncer's."""
        if self.listen_url:
            return self.listen_url
        return None if self.pgbouncer else dsn
