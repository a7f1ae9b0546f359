"""Application versions: which code may run a job during a rolling deploy (issue 34)."""

from __future__ import annotations

import os
import re

from brooq.vocabulary.errors import InvalidInput

APP_VERSION_MAX_LENGTH = 128
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]*")


class InvalidAppVersion(InvalidInput):
    """An application version that brooq cannot store or compare (see :func:`app_version`)."""


def app_version(value: object) -> str | None:
    """``value`` as an application version: None (or ``""``) for none, else a string of 1 to
    128 characters from letters, digits and ``._+:@/-``, starting with a letter or digit
    (``"2026.12.05"``, ``"v2"``, a git sha). InvalidAppVersion names what is wrong."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidAppVersion(
            f"app version must be a string such as 'v2' or a git sha, got {type(value).__name__}"
        )
    if len(value) > APP_VERSION_MAX_LENGTH:
        raise InvalidAppVersion(
            f"app version is {len(value)} characters long; at most {APP_VERSION_MAX_LENGTH}"
        )
    if not _VERSION.fullmatch(value):
        raise InvalidAppVersion(
            f"app version {value!r}: use letters, digits and ._+:@/- only, starting with a "
            "letter or digit (e.g. '2026.12.05' or a git sha)"
        )
    return value


def default_app_version(given: str | None) -> str | None:
    """``given`` checked as :func:`app_version`; when None, ``QUEUE_APP_VERSION`` from the
    environment (where a deploy sets it for every process of the app); else None."""
    return app_version(given if given is not None else os.environ.get("QUEUE_APP_VERSION"))
