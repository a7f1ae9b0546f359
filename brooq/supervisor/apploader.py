"""Importing the app, and importing it again for a reload, with the old modules kept to put back.

What a reload imports again: the app's own package, and what it imported
from outside the standard library and the installed libraries (the
project's own code); never compiled extensions or brooq itself. It imports
them with the module search path and working directory of the first import
(the supervisor's own, whatever changed them since), in the parent and in
the throwaway check alike, so each module is found where it was found first.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from brooq.app import import_path, load_app
from brooq.queue import Queue

_PATHS = sysconfig.get_paths()
_KEPT_PATHS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {_PATHS["stdlib"], _PATHS["platstdlib"], _PATHS["purelib"], _PATHS["platlib"]}
)
"""The standard library and the installed libraries: never imported again by a reload."""


def _reloadable(name: str, module: ModuleType | None, app_package: str) -> bool:
    """A pure-Python module of the app's package, or outside the stdlib and the installed
    libraries (the project's own code); never brooq."""
    if module is None or name == "brooq" or name.startswith("brooq."):
        return False
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return False  # namespace packages, compiled extensions, frozen modules
    if name == app_package or name.startswith(app_package + "."):
        return True  # the app itself, even installed as a wheel
    resolved = str(Path(path).resolve())
    return not resolved.startswith(_KEPT_PATHS) and "-packages" + os.sep not in resolved


class AppLoader:
    """Imports ``--app`` and remembers which modules that brought in, to import them again."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.package = spec.partition(":")[0].partition(".")[0]
        self.modules: set[str] = set()
        self.saved: dict[str, ModuleType] = {}
        """The modules the last :meth:`load_again` forgot."""
        self.loaded_before: set[str] = set()
        """The modules loaded before the last :meth:`load_again` began."""
        self.path: list[str] = []
        """``sys.path`` as the first import began (every entry absolute)."""
        self.cwd = ""
        """The working directory of the first import."""
        self._path_before: list[str] | None = None

    def load(self) -> Queue:
        """The first import (AppLoadError when it fails)."""
        before = set(sys.modules)
        self.path, self.cwd = import_path(), os.getcwd()
        queue = load_app(self.spec, list(self.path))
        self.modules = {
            n for n in set(sys.modules) - before if _reloadable(n, sys.modules[n], self.package)
        }
        return queue

    def load_again(self) -> Queue:
        """Forget the app's modules and import it again; on any error, put the old ones back.

        Runs in a thread of its own (the loop never waits for an import);
        :meth:`put_back` undoes it when the loop gave up waiting.
        """
        saved = {n: sys.modules.pop(n) for n in sorted(self.modules) if n in sys.modules}
        self.saved = saved
        self._path_before = list(sys.path)
        importlib.invalidate_caches()
        before = set(sys.modules)
        self.loaded_before = before
        try:
            queue = load_app(self.spec, list(self.path))
        except BaseException:
            self.put_back()
            raise
        self.modules = {
            n
            for n in (set(sys.modules) - before) | self.modules
            if _reloadable(n, sys.modules.get(n), self.package)
        }
        return queue

    def put_back(self) -> None:
        """Drop what the last :meth:`load_again` imported and restore the modules it forgot,
        and the module search path the old code ran with."""
        for name in set(sys.modules) - self.loaded_before:
            sys.modules.pop(name, None)
        sys.modules.update(self.saved)
        if self._path_before is not None:
            sys.path[:] = self._path_before
