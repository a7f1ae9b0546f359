"""Worker slots: what each serves (`--workers 8` or `a=4,b=2`) and its restart backoff."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from brooq.vocabulary import InvalidInput


class SlotSpecError(InvalidInput):
    """``--workers``/``--topics`` do not describe a valid set of slots."""


def parse_slots(
    workers: int | str, topics: Sequence[str], registered: Sequence[str]
) -> list[list[str]]:
    """One list of topics per slot.

    ``workers`` is a count (every slot serves ``topics``) or comma-separated
    ``topic=count`` pairs (each slot serves its one topic). ``topics`` is what
    this supervisor serves (default: every registered topic).
    """
    served = list(topics) or list(registered)
    unknown = [t for t in served if t not in registered]
    if unknown:
        raise SlotSpecError(
            f"--topics names topics the app does not handle: {', '.join(unknown)}; "
            f"it handles: {', '.join(registered)}"
        )
    text = str(workers).strip()
    if text.isdigit():
        count = int(text)
        if count < 1:
            raise SlotSpecError("--workers must be at least 1")
        return [list(served) for _ in range(count)]
    return _weighted(text, registered)


def _weighted(text: str, registered: Sequence[str]) -> list[list[str]]:
    slots: list[list[str]] = []
    for part in text.split(","):
        topic, sep, count = part.strip().partition("=")
        if not sep or not count.strip().isdigit():
            raise SlotSpecError(
                f"--workers {text!r}: write a count (8) or topic=count pairs "
                "(email.send=4,report=2)"
            )
        if topic.strip() not in registered:
            raise SlotSpecError(
                f"--workers {text!r}: topic {topic.strip()!r} is not handled by the app; "
                f"it handles: {', '.join(registered)}"
            )
        slots += [[topic.strip()] for _ in range(int(count))]
    if not slots:
        raise SlotSpecError("--workers must add up to at least 1 worker")
    return slots


@dataclass
class SlotState:
    """Restart backoff of one slot, so a child that dies at boot does not fork-storm."""

    topics: list[str]
    failures: int = 0
    not_before: float = 0.0

    @property
    def group(self) -> tuple[str, ...]:
        """The topics of this slot as a group key: slots that serve the same topics share jobs."""
        return tuple(sorted(self.topics))

    def boot_failed(self, now: float) -> float:
        """Record a boot failure; return the delay before the next fork."""
        self.failures += 1
        delay: float = min(0.5 * 2 ** (self.failures - 1), 30.0)
        self.not_before = now + delay
        return delay

    def booted(self) -> None:
        """A child of this slot came up: forget earlier failures."""
        self.failures, self.not_before = 0, 0.0
