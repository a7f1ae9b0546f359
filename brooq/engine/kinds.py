"""The registry of kinds: topic → handler and options."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from brooq.engine.middleware import MiddlewareStack
from brooq.vocabulary import (
    BUILTIN_KIND_DEFAULTS,
    Claim,
    Fairness,
    InvalidKindOptions,
    KindNotRegistered,
    KindOptions,
    RateLimit,
    Topic,
)

Handler: TypeAlias = Callable[[Claim], Any | Awaitable[Any]]
"""A handler takes a Claim; it may be a plain function or an ``async def``."""


@dataclass(frozen=True, slots=True)
class Kind:
    """A registered kind: its topic, handler and options as given in code."""

    topic: Topic
    handler: Handler
    options: KindOptions

    @property
    def is_async(self) -> bool:
        """True when the handler is an ``async def``."""
        return inspect.iscoroutinefunction(self.handler)


class Registry:
    """The kinds one application handles, and the defaults for options left unset."""

    def __init__(self, defaults: KindOptions = BUILTIN_KIND_DEFAULTS) -> None:
        self._kinds: dict[str, Kind] = {}
        self._defaults = defaults.with_defaults(BUILTIN_KIND_DEFAULTS)
        self._complete: dict[str, KindOptions] = {}
        """Each topic's options completed with the defaults (asked for on every job)."""
        self.middleware = MiddlewareStack()
        """What wraps every enqueue and every run of a handler (``queue.use``)."""

    @property
    def defaults(self) -> KindOptions:
        """The complete options a kind gets for every field it leaves unset."""
        return self._defaults

    def set_defaults(self, defaults: KindOptions) -> None:
        """Replace the defaults (from configuration); checked against every kind's options."""
        complete = defaults.with_defaults(BUILTIN_KIND_DEFAULTS)
        for kind in self._kinds.values():
            kind.options.with_defaults(complete)
        self._defaults = complete
        self._complete.clear()

    def register(self, topic: str, handler: Handler, options: KindOptions) -> Kind:
        """Add a kind; raises if the topic is taken or the options conflict with the defaults."""
        checked = Topic(topic)
        if checked in self._kinds:
            raise InvalidKindOptions(f"topic {checked!r} already has a handler")
        if not callable(handler):
            raise TypeError(f"handler for {checked!r} is not callable")
        options.with_defaults(self._defaults)
        kind = Kind(checked, handler, options)
        self._kinds[checked] = kind
        return kind

    def get(self, topic: str) -> Kind:
        """The kind of ``topic``; raises KindNotRegistered."""
        try:
            return self._kinds[topic]
        except KeyError:
            raise KindNotRegistered(f"no handler is registered for topic {topic!r}") from None

    def options(self, topic: str) -> KindOptions:
        """The complete options of ``topic``: its own, then the defaults."""
        complete = self._complete.get(topic)
        if complete is None:
            complete = self._complete[topic] = self.get(topic).options.with_defaults(self._defaults)
        return complete

    def job_options(self, topic: str, overrides: KindOptions | None = None) -> KindOptions:
        """The complete options of one job of ``topic``: its kind's (the defaults for a topic
        with no handler here), with the ``overrides`` the job sets for itself."""
        kind = self.options(topic) if topic in self._kinds else self._defaults
        return kind.overridden_by(overrides)

    def rates(self) -> dict[str, RateLimit]:
        """The rate limit of every topic that has one (its claims spend its tokens)."""
        return {t: r for t in self.topics() if (r := self.options(t).rate_limit) is not None}

    def fairness(self) -> dict[str, Fairness]:
        """The fairness of every fair topic (``fairness="round_robin"``)."""
        return {t: f for t in self.topics() if (f := self.options(t).fairness) is not None}

    def topics(self) -> list[str]:
        """Registered topics, sorted."""
        return sorted(self._kinds)

    def __contains__(self, topic: object) -> bool:
        return topic in self._kinds

    def __len__(self) -> int:
        return len(self._kinds)
