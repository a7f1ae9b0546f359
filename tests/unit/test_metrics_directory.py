"""The multiprocess metrics directories: a held lock, not a pid, keeps one from being removed."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from brooq import metrics


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def held_directory(tmp: Path, pid: int) -> tuple[Path, int]:
    path = tmp / f"brooq-metrics-{pid}-abc{pid}"
    path.mkdir()
    fd = os.open(path / metrics.OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return path, fd


def test_a_directory_whose_lock_is_held_stays_even_when_its_pid_is_unknown(tmp: Path) -> None:
    # A pid from another PID namespace looks dead from here: the lock is what counts.
    path, fd = held_directory(tmp, 999_999_999)
    try:
        metrics.remove_stale_directories()
        assert path.exists()
    finally:
        os.close(fd)


def test_a_directory_nobody_holds_is_removed(tmp: Path) -> None:
    path, fd = held_directory(tmp, os.getpid())
    os.close(fd)  # its supervisor died: the lock went with it
    metrics.remove_stale_directories()
    assert not path.exists()


def test_what_brooq_did_not_lock_is_left_alone(tmp: Path) -> None:
    other = tmp / "brooq-metrics-1-notours"
    other.mkdir()
    (other / "counter_w0.db").write_bytes(b"")
    metrics.remove_stale_directories()
    assert other.exists()


def test_hold_directory_locks_it_for_this_process(tmp: Path) -> None:
    path = tmp / "brooq-metrics-1-mine"
    path.mkdir()
    metrics.hold_directory(str(path))
    try:
        metrics.remove_stale_directories()
        assert path.exists()
    finally:
        os.close(metrics._held.pop())
