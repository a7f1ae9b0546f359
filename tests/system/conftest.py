"""Fixtures of the system tests: supervisors started as real processes, always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system.harness import Supervisor

SUPERVISORS = pytest.StashKey[list[Supervisor]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Attach the tail of every supervisor's log to a failing test's report."""
    report = yield
    if report.failed:
        for sup in item.stash.get(SUPERVISORS, []):
            report.sections.append((f"supervisor {sup.log_path.name} (tail)", sup.log_tail()))
    return report


@pytest.fixture
def supervise(
    request: pytest.FixtureRequest, dsn: str, tmp_path: Path
) -> Iterator[Callable[..., Supervisor]]:
    """``supervise(*args, app=..., name=..., env=...)`` starts ``brooq supervise``.

    Every supervisor started is stopped at teardown (SIGTERM, then SIGKILL of
    its group and of every worker it was seen to run), even when the test failed.
    """
    started: list[Supervisor] = []
    request.node.stash[SUPERVISORS] = started

    def start(
        *args: str,
        app: str = "sysapp:queue",
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Supervisor:
        sup = Supervisor(
            dsn, tmp_path, app=app, args=args, env=env, name=name or f"supervisor{len(started)}"
        )
        started.append(sup)
        return sup.start()

    yield start
    for sup in started:
        sup.stop(timeout=30)
