"""Is the database's schema the one this brooq was built for?

Each migration leaves a mark in the catalog (a table, a column, an index, a
storage option) that :data:`MARKS` names; a database lacks a migration when
it lacks that mark, however it was migrated (``brooq migrate``, Alembic,
Django). ``brooq migrate``'s own bookkeeping also tells of migrations newer
than this brooq (ahead). A test applies the migrations one at a time and
checks that each mark appears with its migration, and that every shipped
migration has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from brooq import __version__

MARKS = {
    "0001.job": "relation:job",
    # job_idempotency_idx, its first mark, is replaced by job_key in 0009.
    "0002.job-indexes": "relation:job_terminal_idx",
    "0003.job-autovacuum": "option:autovacuum_vacuum_scale_factor",
    "0004.job-priority": "column:priority",
    "0005.job-expirations": "column:expirations",
    "0006.job-last-traceback": "column:last_traceback",
    "0007.supervisor": "relation:brooq_supervisor",
    "0008.job-expiry-streak": "column:expiry_streak",
    "0009.job-partitions": "relation:job_key",
    "0010.job-result": "column:result",
    "0011.rate-limit": "relation:brooq_rate_limit",
    "0012.job-workflows": "relation:job_edge",
    "0013.job-overrides": "column:trace_context",
    "0014.topic-pause": "relation:brooq_topic_pause",
    "0015.app-versions": "column:app_version",
    "0016.fair-cursor": "relation:brooq_fair_cursor",
    "0017.ready-xid": "column:ready_xid",
}
"""What each shipped migration leaves in the catalog (facts of the ``schema_facts`` query)."""

YOYO_READABLE = "readable:_yoyo_migration"


@dataclass(frozen=True, slots=True)
class SchemaState:
    """How the database's migrations compare with this brooq's."""

    missing: tuple[str, ...]
    """Shipped migrations whose mark the database lacks, in order."""
    unknown: tuple[str, ...]
    """Migrations ``brooq migrate`` recorded that this brooq does not ship (a newer one's)."""

    @property
    def matches(self) -> bool:
        """True when the database has exactly this brooq's migrations."""
        return not self.missing and not self.unknown


def compare(shipped: list[str], facts: set[str], recorded: list[str]) -> SchemaState:
    """The state of a database with catalog ``facts`` and ``recorded`` (bookkeeping) ids.

    A shipped migration without a mark in MARKS is a bug of this brooq (KeyError).
    """
    missing = tuple(m for m in shipped if MARKS[m] not in facts)
    unknown = tuple(m for m in recorded if m not in shipped)
    return SchemaState(missing, unknown)


def behind_message(detail: str) -> str:
    """What to do about a database behind this brooq when its missing migrations cannot be
    named (``detail``: what a statement of brooq's found missing)."""
    return (
        f"the database schema is behind this brooq ({__version__}): {detail}; run "
        "`brooq migrate up` (or apply the migrations from your own Alembic or Django "
        "migrations: docs/integrations.md)"
    )


def mismatch_message(state: SchemaState) -> str:
    """What is wrong and the command to run, one line (empty when the schema matches)."""
    if state.missing:
        return (
            f"the database schema is behind this brooq ({__version__}): migrations "
            f"{', '.join(state.missing)} are not applied; run `brooq migrate up` (or apply "
            "them from your own Alembic or Django migrations: docs/integrations.md)"
        )
    if state.unknown:
        return (
            f"the database schema is ahead of this brooq ({__version__}): it has migrations "
            f"this brooq does not know ({', '.join(state.unknown)}), applied by a newer brooq; "
            "run that brooq, or roll them back with its `brooq migrate down` once nothing "
            "needs them"
        )
    return ""
