"""Fixtures of the chaos suite: runs whose supervisors are always stopped, log tails on failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.rig import Run, mark_result

RUNS = pytest.StashKey[list[Run]]()


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (pyproject.toml is shared; the marker lives with its suite)."""
    config.addinivalue_line(
        "markers", "chaos: fault injection over thousands of jobs (CHAOS_SIZE=quick|full)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Record pass/fail in the results file; attach the supervisors' log tails on failure."""
    report = yield
    if report.when == "call":
        for run in item.stash.get(RUNS, []):
            mark_result(run, passed=report.passed)
    if report.failed:
        for run in item.stash.get(RUNS, []):
            for sup in run.supervisors:
                report.sections.append(
                    (f"{run.name}: {sup.log_path.name} (tail)", sup.log_tail(60))
                )
    return report


@pytest.fixture
def chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """``chaos(name, fault, dsn)`` makes a Run; every supervisor it started is stopped after."""
    runs: list[Run] = []
    request.node.stash[RUNS] = runs

    def make(name: str, fault: str, dsn: str) -> Run:
        run = Run(name, fault, dsn, tmp_path)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop_all()
