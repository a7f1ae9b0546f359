"""The worker's board with a real fork: a job is started or taken back, never both.

A forked process plays the worker, starting jobs 1..N from its queue as fast as it can;
the parent plays the supervisor, raising fences at random moments. Afterwards every job
was either started by the worker or taken back by the parent, and no job was both.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from brooq.supervisor.board import Board

pytestmark = pytest.mark.system

JOBS = 20_000


def test_a_job_is_started_or_taken_back_never_both(tmp_path: object) -> None:
    board = Board()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: start every job it may, write down which
        os.close(r)
        ran = [seq for seq in range(1, JOBS + 1) if board.start(seq)]
        os.write(w, ",".join(map(str, ran)).encode() + b"\n")
        os._exit(0)
    os.close(w)
    taken: set[int] = set()
    rng = random.Random(7)
    deadline = time.monotonic() + 30
    last_sent = 0
    while time.monotonic() < deadline:
        last_sent = min(JOBS, last_sent + rng.randint(1, 400))  # jobs "sent" so far
        fence_from = board.take_back(last_sent)
        if fence_from is not None:
            taken |= set(range(fence_from + 1, last_sent + 1))
        if last_sent == JOBS:
            break
    chunks = []
    while chunk := os.read(r, 1 << 20):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    started = {int(s) for s in b"".join(chunks).decode().strip().split(",") if s}
    # A fence covers what was sent and not started when it went up; a later start of a
    # job under an older fence is refused. So: no job both started and taken back.
    assert not started & taken, sorted(started & taken)[:10]
    assert started, "the worker started nothing"
    assert taken, "no fence caught a job: the race was not run"
