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


def load_app(spec: str) -> Queue:
    """Import ``module:attribute`` (the current directory is on the path) and return the Queue."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app {spec!r} must look like module:attribute, e.g. myapp.jobs:queue")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
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
