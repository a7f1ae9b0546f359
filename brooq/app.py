"""Loading the user's application: ``--app module:attribute`` naming a brooq.Queue."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from brooq.queue import Queue
from brooq.vocabulary import InvalidInput


class AppLoadError(InvalidInput):
    """The --app value does not name an importable brooq.Queue."""


def import_path() -> list[str]:
    """The module search path an app is imported with: ``sys.path``, the current directory
    first unless it is on it already, every entry absolute (as resolved from here and now).

    A reload imports the app again with this same list (see brooq.supervisor.apploader), so
    that it finds each module where the first import found it, whatever its working
    directory or its interpreter's own ``sys.path[0]``.
    """
    cwd = os.getcwd()
    path = [p if os.path.isabs(p) else os.path.abspath(p) for p in sys.path]  # "" is cwd
    return path if cwd in path else [cwd, *path]


def load_app(spec: str, path: list[str] | None = None) -> Queue:
    """Import ``module:attribute`` and return the Queue.

    ``path`` becomes ``sys.path`` first (default: :func:`import_path`, the current
    directory on it).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app {spec!r} must look like module:attribute, e.g. myapp.jobs:queue")
    sys.path[:] = import_path() if path is None else path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppLoadError(
            f"--app {spec!r}: no module named {exc.name!r} (run from your project's folder "
            "or set PYTHONPATH)"
        ) from None
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise AppLoadError(
            f"--app {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc} "
            f"(at {where.filename}:{where.lineno})"
        ) from None
    try:
        queue = getattr(module, attr)
    except AttributeError:
        raise AppLoadError(
            f"--app {spec!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None
    if not isinstance(queue, Queue):
        raise AppLoadError(
            f"--app {spec!r}: {attr!r} is a {type(queue).__name__}, not a brooq.Queue"
        )
    if not len(queue.registry):
        raise AppLoadError(
            f"--app {spec!r}: the queue has no kinds; register handlers with @queue.kind"
        )
    return queue
