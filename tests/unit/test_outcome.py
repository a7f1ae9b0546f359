"""The retry decision: every signal, every error, first and last attempt."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq.engine.outcome import (
    DONE,
    LAST_ERROR_MAX_CHARS,
    Outcome,
    SettleKind,
    WorkerCrashed,
    crash_outcome,
    decide,
    describe_error,
)
from brooq.vocabulary import (
    BUILTIN_KIND_DEFAULTS,
    AttemptTimedOut,
    CancelJob,
    Delay,
    Interrupted,
    JobCanceledWhileRunning,
    KindOptions,
    LeaseLost,
    PreserveAttempt,
    State,
)

OPTIONS = KindOptions(
    max_attempts=3, backoff_base=timedelta(seconds=1), backoff_max=timedelta(minutes=1)
).with_defaults(BUILTIN_KIND_DEFAULTS)
LAST = 3


def half() -> float:
    return 0.5


def run(error: BaseException | None, attempt: int = 1, options: KindOptions = OPTIONS) -> Outcome:
    return decide(error, attempt, options, rand=half)


def raised(exc: BaseException) -> BaseException:
    """``exc`` after a real raise, with a traceback (as the runner sees it)."""
    try:
        raise exc
    except BaseException as caught:
        return caught


class CustomBase(BaseException):
    """A BaseException a handler might raise (neither Exception nor a brooq signal)."""


# --- success --------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, LAST, 99])
def test_success_is_done_even_on_and_after_the_last_attempt(attempt: int) -> None:
    outcome = run(None, attempt)
    assert outcome == DONE
    assert outcome.kind is SettleKind.DONE
    assert outcome.state is State.DONE
    assert outcome.label == "done"
    assert outcome.error is None
    assert outcome.retry_in is None
    assert not outcome.refund_attempt


# --- plain failures -------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2])
def test_plain_exception_fails_with_backoff(attempt: int) -> None:
    outcome = run(raised(ValueError("bad input")), attempt)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.state is State.FAILED
    assert outcome.label == "failed"
    ceiling = timedelta(seconds=2 ** (attempt - 1))
    assert outcome.retry_in is not None
    assert ceiling / 2 <= outcome.retry_in <= ceiling
    assert outcome.retry_in == ceiling * 3 / 4  # rand 0.5: the middle of [d/2, d]
    assert not outcome.refund_attempt
    assert outcome.error is not None
    assert "ValueError" in outcome.error
    assert "bad input" in outcome.error


@pytest.mark.parametrize("attempt", [LAST, LAST + 1])
def test_plain_exception_on_the_last_attempt_is_dead(attempt: int) -> None:
    outcome = run(raised(RuntimeError("boom")), attempt)
    assert outcome.kind is SettleKind.DEAD
    assert outcome.state is State.DEAD
    assert outcome.label == "dead"
    assert outcome.retry_in is None
    assert not outcome.refund_attempt
    assert outcome.error is not None and "RuntimeError: boom" in outcome.error


def test_single_attempt_kind_dies_at_once() -> None:
    options = KindOptions(max_attempts=1).with_defaults(BUILTIN_KIND_DEFAULTS)
    assert run(ValueError("x"), 1, options).kind is SettleKind.DEAD


def test_retry_in_uses_the_kind_backoff() -> None:
    options = KindOptions(
        max_attempts=10, backoff_base=timedelta(seconds=10), backoff_max=timedelta(seconds=30)
    ).with_defaults(BUILTIN_KIND_DEFAULTS)
    retries = [decide(ValueError(), a, options, rand=lambda: 0.0).retry_in for a in range(1, 5)]
    assert retries == [timedelta(seconds=s) for s in (5, 10, 15, 15)]


@given(attempt=st.integers(min_value=1, max_value=LAST - 1), rand=st.floats(0, 1, exclude_max=True))
def test_failure_retry_is_within_backoff_bounds(attempt: int, rand: float) -> None:
    outcome = decide(ValueError(), attempt, OPTIONS, rand=lambda: rand)
    ceiling = min(timedelta(seconds=2 ** (attempt - 1)), timedelta(minutes=1))
    assert outcome.kind is SettleKind.FAILED
    assert outcome.retry_in is not None
    assert ceiling / 2 <= outcome.retry_in <= ceiling


# --- Delay ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, 0), (5, 5), (59.5, 59.5), (60, 60), (61, 60), (3600, 60), (10**6, 60)],
)
def test_delay_retries_after_the_delay_clamped_to_backoff_max(
    seconds: float, expected: float
) -> None:
    outcome = run(raised(Delay(seconds)), 1)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.label == "delayed"
    assert outcome.retry_in == timedelta(seconds=expected)
    assert not outcome.refund_attempt
    assert outcome.error is not None and "Delay" in outcome.error


def test_delay_accepts_a_timedelta() -> None:
    assert run(Delay(timedelta(seconds=7))).retry_in == timedelta(seconds=7)


def test_delay_rejects_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="negative"):
        Delay(-1)


@pytest.mark.parametrize("attempt", [LAST, LAST + 2])
def test_delay_on_the_last_attempt_is_dead(attempt: int) -> None:
    outcome = run(raised(Delay(5)), attempt)
    assert outcome.kind is SettleKind.DEAD
    assert outcome.label == "dead"
    assert not outcome.refund_attempt


# --- PreserveAttempt ------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, LAST, LAST + 5])
def test_preserve_attempt_refunds_and_is_never_dead(attempt: int) -> None:
    outcome = run(raised(PreserveAttempt("upstream is down")), attempt)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.state is State.FAILED
    assert outcome.label == "preserved"
    assert outcome.refund_attempt
    assert outcome.retry_in is not None and timedelta(0) < outcome.retry_in <= timedelta(minutes=1)
    assert outcome.error is not None and "upstream is down" in outcome.error


def test_preserve_attempt_with_default_reason() -> None:
    outcome = run(PreserveAttempt())
    assert outcome.error is not None and "PreserveAttempt" in outcome.error


# --- CancelJob ------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, LAST, LAST + 1])
def test_cancel_job_cancels_whatever_attempts_are_left(attempt: int) -> None:
    outcome = run(raised(CancelJob("customer deleted")), attempt)
    assert outcome.kind is SettleKind.CANCELED
    assert outcome.state is State.CANCELED
    assert outcome.label == "canceled"
    assert outcome.retry_in is None
    assert not outcome.refund_attempt
    assert outcome.error is not None and "customer deleted" in outcome.error


# --- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("interrupt", [LeaseLost(), JobCanceledWhileRunning(), LeaseLost("x")])
@pytest.mark.parametrize("attempt", [1, LAST])
def test_lost_lease_and_cancel_while_running_write_nothing(
    interrupt: Interrupted, attempt: int
) -> None:
    outcome = run(raised(interrupt), attempt)
    assert outcome.kind is SettleKind.ABANDON
    assert outcome.state is None
    assert outcome.label == "abandoned"
    assert outcome.retry_in is None
    assert not outcome.refund_attempt


def test_attempt_timed_out_is_a_failure() -> None:
    outcome = run(raised(AttemptTimedOut()), 1)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.label == "failed"
    assert outcome.retry_in is not None
    assert outcome.error is not None
    assert "AttemptTimedOut" in outcome.error and "timed out" in outcome.error


def test_attempt_timed_out_on_the_last_attempt_is_dead() -> None:
    assert run(raised(AttemptTimedOut()), LAST).kind is SettleKind.DEAD


def test_bare_interrupted_is_a_failure() -> None:
    assert run(raised(Interrupted()), 1).kind is SettleKind.FAILED


def test_interrupts_are_base_exceptions_not_swallowed_by_except_exception() -> None:
    for cls in (AttemptTimedOut, LeaseLost, JobCanceledWhileRunning):
        assert issubclass(cls, Interrupted)
        assert issubclass(cls, BaseException)
        assert not issubclass(cls, Exception)


# --- signals through the cause chain --------------------------------------------------------


def test_signal_found_through_cause() -> None:
    try:
        raise ValueError("wrapper") from CancelJob("deep")
    except ValueError as exc:
        outcome = run(exc)
    assert outcome.kind is SettleKind.CANCELED
    assert outcome.error is not None and "deep" in outcome.error


def test_signal_found_through_context() -> None:
    try:
        try:
            raise CancelJob("inner")
        except CancelJob:
            raise KeyError("while handling")  # noqa: B904 - implicit context on purpose
    except KeyError as exc:
        assert isinstance(exc.__context__, CancelJob)
        outcome = run(exc)
    assert outcome.kind is SettleKind.CANCELED


def test_signal_raised_inside_except_block_is_found() -> None:
    try:
        try:
            raise PreserveAttempt("first")
        except PreserveAttempt:
            raise RuntimeError("second")  # noqa: B904 - implicit context on purpose
    except RuntimeError as exc:
        outcome = run(exc, LAST)
    assert outcome.label == "preserved"
    assert outcome.refund_attempt


@pytest.mark.parametrize(
    ("signal", "kind"),
    [
        (Delay(3), SettleKind.FAILED),
        (PreserveAttempt(), SettleKind.FAILED),
        (CancelJob(), SettleKind.CANCELED),
        (LeaseLost(), SettleKind.ABANDON),
        (JobCanceledWhileRunning(), SettleKind.ABANDON),
        (AttemptTimedOut(), SettleKind.FAILED),
    ],
)
def test_every_signal_found_two_levels_deep(signal: BaseException, kind: SettleKind) -> None:
    try:
        try:
            try:
                raise signal
            except BaseException as first:
                raise OSError("middle") from first
        except OSError:
            raise TypeError("outer")  # noqa: B904
    except TypeError as exc:
        outcome = run(exc)
    assert outcome.kind is kind


def test_delay_found_through_cause_keeps_its_delay() -> None:
    try:
        raise ValueError("x") from Delay(12)
    except ValueError as exc:
        outcome = run(exc)
    assert outcome.label == "delayed"
    assert outcome.retry_in == timedelta(seconds=12)


def test_first_signal_in_the_chain_wins() -> None:
    outer = CancelJob("outer")
    outer.__cause__ = Delay(5)
    assert run(outer).kind is SettleKind.CANCELED


def test_cyclic_cause_chain_terminates() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    outcome = run(a)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.error is not None and "ValueError: a" in outcome.error


# --- last_error ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [LAST_ERROR_MAX_CHARS - 20, LAST_ERROR_MAX_CHARS, 10**6])
def test_last_error_is_bounded_and_names_type_and_message(size: int) -> None:
    message = "x" * size
    outcome = run(raised(ValueError(message)))
    assert outcome.error is not None
    assert len(outcome.error) <= LAST_ERROR_MAX_CHARS
    assert outcome.error.startswith("ValueError: xxx")


def test_last_error_of_a_multiline_message_keeps_it() -> None:
    error = describe_error(RuntimeError("line one\nline two"))
    assert error.startswith("RuntimeError: line one")
    assert "line two" in error


def test_last_error_has_no_nul() -> None:
    error = describe_error(ValueError("a\x00b"))
    assert "\x00" not in error
    assert "ValueError" in error


def test_last_error_of_an_exception_whose_str_raises() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    outcome = run(raised(Weird()))
    assert outcome.kind is SettleKind.FAILED
    assert outcome.error is not None and "Weird" in outcome.error


@given(st.text(max_size=3000))
def test_describe_error_is_bounded_for_any_text(text: str) -> None:
    error = describe_error(ValueError(text))
    assert len(error) <= LAST_ERROR_MAX_CHARS
    assert error.startswith("ValueError")
    assert "\x00" not in error


# --- BaseExceptions a handler may raise ----------------------------------------------------


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (SystemExit(3), "SystemExit"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (CustomBase("custom"), "CustomBase"),
        (GeneratorExit(), "GeneratorExit"),
    ],
)
def test_base_exceptions_are_recorded_failures(error: BaseException, name: str) -> None:
    outcome = run(raised(error), 1)
    assert outcome.kind is SettleKind.FAILED
    assert outcome.error is not None and name in outcome.error
    assert run(raised(error), LAST).kind is SettleKind.DEAD


# --- options and crashes --------------------------------------------------------------------


def test_builtin_defaults_give_five_attempts() -> None:
    assert decide(ValueError(), 4, BUILTIN_KIND_DEFAULTS).kind is SettleKind.FAILED
    assert decide(ValueError(), 5, BUILTIN_KIND_DEFAULTS).kind is SettleKind.DEAD


def test_crash_outcome_is_a_recorded_failure() -> None:
    first = crash_outcome("killed by SIGKILL", 1, OPTIONS)
    assert first.kind is SettleKind.FAILED
    assert first.error is not None and "SIGKILL" in first.error
    assert "WorkerCrashed" in first.error
    assert crash_outcome("exit code 139", LAST, OPTIONS).kind is SettleKind.DEAD
    assert issubclass(WorkerCrashed, Exception)
