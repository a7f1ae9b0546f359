"""The reload's pieces without a supervisor: importing the app again, and what systemd hears."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from brooq.app import AppLoadError
from brooq.supervisor.apploader import AppLoader
from brooq.supervisor.reload import CHECK_PASSED, IMPORT_PATH_ENV, main
from brooq.supervisor.systemd import Notifier

APP = """
import brooq
import brooq.testing
import sortedcontainers
VERSION = {version!r}
queue = brooq.Queue(brooq.testing.InMemoryStore())

@queue.kind("work")
def work(claim: brooq.Claim) -> None:
    pass
{extra}
"""


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "path", list(sys.path))  # an import puts its folder on it
    yield tmp_path
    for name in ("unit_reload_app", "unit_reload_helper"):
        sys.modules.pop(name, None)


def write(directory: Path, version: str, extra: str = "") -> None:
    (directory / "unit_reload_helper.py").write_text(f"HELPER = {version!r}\n")
    text = APP.format(version=version, extra=extra) + "import unit_reload_helper\n"
    (directory / "unit_reload_app.py").write_text(text + "#" * len(version + extra) + "\n")


def test_load_again_imports_the_new_code_and_its_helpers(app_dir: Path) -> None:
    write(app_dir, "v1")
    loader = AppLoader("unit_reload_app:queue")
    loader.load()
    assert {"unit_reload_app", "unit_reload_helper"} <= loader.modules
    assert "brooq" not in loader.modules and "json" not in loader.modules
    assert not {n for n in loader.modules if n.startswith("sortedcontainers")}, "a library"
    write(app_dir, "v22")
    loader.load_again()
    assert sys.modules["unit_reload_app"].VERSION == "v22"
    assert sys.modules["unit_reload_helper"].HELPER == "v22"


def test_a_broken_import_puts_the_old_modules_back(app_dir: Path) -> None:
    write(app_dir, "v1")
    loader = AppLoader("unit_reload_app:queue")
    queue = loader.load()
    old = sys.modules["unit_reload_app"]
    write(app_dir, "v3", extra="raise RuntimeError('broken')")
    with pytest.raises(AppLoadError, match="broken"):
        loader.load_again()
    assert sys.modules["unit_reload_app"] is old
    assert old.queue is queue


def test_the_check_prints_one_line_and_fails(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(app_dir, "v3", extra="raise RuntimeError('broken')")
    assert main(["--app", "unit_reload_app:queue"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "broken" in out[0]


def test_systemd_hears_reloading_then_ready(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": str(path)})
        notifier.reloading("checking")
        first = sock.recv(4096).decode().splitlines()
        notifier.reloaded("done")
        second = sock.recv(4096).decode().splitlines()
    assert first[0] == "RELOADING=1" and first[1].startswith("MONOTONIC_USEC=")
    assert second[0] == "READY=1"


def test_load_again_finds_the_app_where_the_first_import_found_it(
    app_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32, item 15: the reload put the working directory of the moment first on
    sys.path, so a module of the same name there replaced the app."""
    write(app_dir, "v1")
    loader = AppLoader("unit_reload_app:queue")
    loader.load()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    write(elsewhere, "other")
    monkeypatch.chdir(elsewhere)  # the app's import, or a library, changed directory
    write(app_dir, "v2")
    loader.load_again()
    assert sys.modules["unit_reload_app"].VERSION == "v2"
    assert Path(sys.modules["unit_reload_app"].__file__ or "").parent == app_dir


def test_the_check_imports_with_the_path_it_is_given(
    app_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hidden = tmp_path_factory.mktemp("hidden")
    write(hidden, "v1")  # on no path the check would have of its own
    assert main(["--app", "unit_reload_app:queue"]) == 1
    assert "no module named 'unit_reload_app'" in capsys.readouterr().out
    monkeypatch.setenv(IMPORT_PATH_ENV, json.dumps([str(hidden), *sys.path]))
    assert main(["--app", "unit_reload_app:queue"]) == 0
    assert capsys.readouterr().out.strip() == CHECK_PASSED
