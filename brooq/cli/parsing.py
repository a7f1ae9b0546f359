"""The parser of every ``brooq`` command: a flag is taken only as written, never abbreviated.

argparse takes any unambiguous prefix of a flag by default, so a typo could
set another setting than the one meant (``brooq supervise --worker 4`` ran
4 workers; ``migrate down --step 2`` rolled back 2). `StrictParser` refuses
them (exit 2) and says which flag was probably meant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

_UNRECOGNIZED = "unrecognized argument: "


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser without abbreviations, whose error names the flag a prefix was meant for.

    The parsers of its commands are StrictParsers too: argparse makes a
    parser's subparsers of the parser's own class.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    # typeshed overloads this method only to type the namespace; one signature serves all.
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """As argparse's, but a prefix of one of this parser's flags is refused first (exit 2).

        First, because argparse would report another problem instead (``--app``
        missing, when ``--worker`` was meant for ``--workers``).
        """
        given = list(sys.argv[1:] if args is None else args)
        if problems := self._abbreviations(given):
            self.error("; ".join(problems))
        return super().parse_known_args(args, namespace)

    def _abbreviations(self, given: list[str]) -> list[str]:
        """What each prefix of this parser's flags in ``given`` was probably meant to be.

        A flag of a command (below this parser) is never taken for a prefix of
        this parser's: ``--log-jobs`` is one of ``supervise``.
        """
        own = {flag for action in self._actions for flag in action.option_strings}
        known = _flags_below(self)
        problems = []
        for token in given:
            if token == "--":
                break  # what follows is positional
            name = token.split("=", 1)[0]
            if not name.startswith("--") or name in known:
                continue
            # Closest first: the shortest flag the prefix may have been cut from.
            if meant := sorted((f for f in own if f.startswith(name)), key=lambda f: (len(f), f)):
                problems.append(
                    f"{_UNRECOGNIZED}{name} (did you mean {' or '.join(meant)}? "
                    "flags are never abbreviated)"
                )
        return problems


def _flags_below(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its commands, and of theirs."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                flags |= _flags_below(command)
    return flags
