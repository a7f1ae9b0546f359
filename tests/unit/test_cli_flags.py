"""Flags are taken only as written: argparse's abbreviations are refused on every parser.

Issue 32, item 10: ``brooq supervise --worker 4`` was taken as ``--workers 4``,
``brooq migrate down --step 2`` as ``--steps 2``: a typo could change what runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from brooq import demo
from brooq.cli import main, parser
from brooq.supervisor import reload


def every_parser(top: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``top`` and every parser below it (commands, and the actions of ``brooq jobs``)."""
    yield top
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in set(action.choices.values()):
                yield from every_parser(command)


def test_no_parser_of_the_brooq_command_takes_abbreviations() -> None:
    parsers = list(every_parser(parser()))
    assert len(parsers) > 15  # brooq, its commands and the actions of `brooq jobs`
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize(
    ("argv", "flag", "meant"),
    [
        (["supervise", "--worker", "4"], "--worker", "--workers"),
        (["work", "--lea", "5m"], "--lea", "--lease"),
        (["migrate", "down", "--step", "2"], "--step", "--steps"),
        (["jobs", "cancel", "--top", "email.send"], "--top", "--topic"),
        (["jobs", "list", "--lim", "5"], "--lim", "--limit"),
        (["status", "--js"], "--js", "--json"),
        (["--log-form", "json", "config", "show"], "--log-form", "--log-format"),
        (["config", "show", "--env-f", "x.env"], "--env-f", "--env-file"),
    ],
)
def test_an_abbreviated_flag_is_refused_with_exit_2_naming_the_flag(
    argv: list[str], flag: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {flag}" in err or f"unrecognized argument: {flag}" in err
    assert f"did you mean {meant}" in err and "flags are never abbreviated" in err, err


def test_a_flag_that_is_nobody_s_prefix_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--frobnicate"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --frobnicate" in err and "did you mean" not in err


@pytest.mark.parametrize(
    ("module_main", "argv"),
    [(demo.main, ["--job", "3"]), (reload.main, ["--ap", "x:queue"])],
)
def test_the_module_commands_refuse_abbreviations_too(
    module_main: object, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(module_main)
    with pytest.raises(SystemExit) as exited:
        module_main(argv)
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err
