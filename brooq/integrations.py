"""The psycopg 3 connection under SQLAlchemy or Django (``brooq.postgres.integrations``).

Kept at this path for imports: ``from brooq.integrations import django_connection``.
"""

from brooq.postgres.integrations import NotPsycopg3, django_connection, sqlalchemy_connection

__all__ = ["NotPsycopg3", "django_connection", "sqlalchemy_connection"]
