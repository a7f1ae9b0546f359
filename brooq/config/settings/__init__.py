"""Every setting of brooq, declared once: the table that `Settings`, the flags, the help,
`config show` and `.env.example` are all made from.

Each module of this package declares one group of settings as `Key` class
attributes (`database`, `workers`, `kinds`, `maintenance`, `enqueue`,
`surface`); `table` joins the groups into `Settings`. Adding a setting is one
`Key` in its group plus its use. A key holds its environment name, kind
(syntax and bounds), default, help text, section, the commands whose flag
sets it, and whether it is secret (never shown, never a flag). Read values
as attributes of a `Settings`: ``settings.lease``.
"""

from brooq.config.settings.key import DASHBOARD, GLOBAL, SUPERVISE, WORK, Key
from brooq.config.settings.kinds import KindDefaults
from brooq.config.settings.surface import LogFormat, LogLevel
from brooq.config.settings.table import (
    BY_ATTR,
    BY_ENV,
    BY_NAME,
    KEYS,
    ORDERED,
    SECTIONS,
    Settings,
    order_problems,
)

__all__ = [
    "BY_ATTR",
    "BY_ENV",
    "BY_NAME",
    "DASHBOARD",
    "GLOBAL",
    "KEYS",
    "ORDERED",
    "SECTIONS",
    "SUPERVISE",
    "WORK",
    "Key",
    "KindDefaults",
    "LogFormat",
    "LogLevel",
    "Settings",
    "order_problems",
]
