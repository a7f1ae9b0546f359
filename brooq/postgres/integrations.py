"""The psycopg 3 connection under SQLAlchemy or Django, to enqueue inside their transaction.

::

    with Session(engine) as session, session.begin():
        session.add(order)
        queue.enqueue(job, conn=sqlalchemy_connection(session))

    with transaction.atomic():
        order.save()
        queue.enqueue(job, conn=django_connection())

The job commits or rolls back with the framework's transaction. Neither
framework is imported until one of these functions is called, so brooq does
not depend on them. Both need the psycopg 3 driver: SQLAlchemy with a
``postgresql+psycopg://`` URL, Django 4.2+ with ``psycopg`` installed.
"""

from __future__ import annotations

from typing import Any

import psycopg

from brooq.vocabulary import BrooqError

__all__ = ["NotPsycopg3", "django_connection", "sqlalchemy_connection"]


class NotPsycopg3(BrooqError, TypeError):
    """The framework's connection is not a psycopg 3 connection; brooq cannot write on it."""


def sqlalchemy_connection(session_or_connection: Any) -> psycopg.Connection[Any]:
    """The psycopg Connection under a SQLAlchemy ``Session`` or ``Connection``.

    For a Session this is the connection of its current transaction (begun
    if none is). Raises :class:`NotPsycopg3` for another driver.
    """
    from sqlalchemy.engine import Connection

    source = session_or_connection
    if isinstance(source, Connection):
        connection = source
    elif callable(getattr(source, "connection", None)):  # Session, scoped_session
        connection = source.connection()
    else:
        raise TypeError(
            "sqlalchemy_connection() takes a SQLAlchemy Session or Connection, "
            f"not {type(source).__name__}"
        )
    driver = connection.connection.driver_connection
    return _psycopg(driver, "SQLAlchemy", "use a postgresql+psycopg:// URL")


def django_connection(alias: str = "default") -> psycopg.Connection[Any]:
    """The psycopg Connection of Django's database ``alias`` (connecting if needed).

    Inside ``transaction.atomic()`` it is in Django's transaction. Raises
    :class:`NotPsycopg3` unless the backend is PostgreSQL over psycopg 3.
    """
    from django.db import connections

    wrapper = connections[alias]
    wrapper.ensure_connection()
    return _psycopg(
        wrapper.connection,
        "Django",
        "use ENGINE django.db.backends.postgresql with psycopg 3 installed (Django 4.2+)",
    )


def _psycopg(driver: object, framework: str, hint: str) -> psycopg.Connection[Any]:
    if isinstance(driver, psycopg.Connection):
        return driver
    name = f"{type(driver).__module__}.{type(driver).__qualname__}"
    raise NotPsycopg3(f"{framework}'s connection is a {name}, not a psycopg 3 connection; {hint}")
