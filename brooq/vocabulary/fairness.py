"""Fair claiming across keys (issue 34): within a topic and a priority, keys take turns.

A fair topic's jobs are grouped by their ``rate_key`` (the tenant, customer or account the
job is for; jobs without one share one turn). A claim takes each key's oldest ready jobs in
turn, ``weight`` jobs per turn for a key with a weight, so a key with 200,000 jobs ready
never makes another key's 10 wait behind them all; a key alone gets everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ROUND_ROBIN = "round_robin"
FAIRNESS_POLICIES = (ROUND_ROBIN,)
"""The values ``fairness`` accepts."""
MAX_WEIGHT = 1000
"""The largest weight of a key: the jobs it takes per turn."""


@dataclass(frozen=True, slots=True)
class Fairness:
    """How a fair topic's keys take turns: ``weights`` (key, jobs per turn), sorted by key;
    every key not named takes one job per turn. Built by :func:`parse_fairness`."""

    weights: tuple[tuple[str, int], ...] = ()

    def weight(self, key: str | None) -> int:
        """The jobs ``key`` (None: jobs without one) takes per turn."""
        return dict(self.weights).get(key, 1) if key is not None else 1

    @property
    def keys(self) -> list[str]:
        """The keys with a weight, in order (the claim's parameter)."""
        return [k for k, _ in self.weights]

    @property
    def counts(self) -> list[int]:
        """Their weights, in the same order."""
        return [w for _, w in self.weights]


def parse_fairness(policy: object, weights: object) -> tuple[Fairness | None, list[str]]:
    """A kind's ``fairness`` and ``fair_weights`` options as a Fairness, and the problems
    found (each naming the option and what to write instead)."""
    if policy is None:
        if weights is not None:
            return None, [
                f'fair_weights: needs fairness="{ROUND_ROBIN}", got only fair_weights={weights!r}'
            ]
        return None, []
    if isinstance(policy, Fairness):
        return policy, []
    if policy not in FAIRNESS_POLICIES:
        return None, [f'fairness: must be "{ROUND_ROBIN}" (or None), got {policy!r}']
    if weights is None:
        return Fairness(), []
    if not isinstance(weights, Mapping):
        return None, [
            f'fair_weights: must map keys to weights, like {{"tenant-42": 3}}, got {weights!r}'
        ]
    problems = [p for k, w in weights.items() if (p := _weight_problem(k, w))]
    if problems:
        return None, problems
    return Fairness(tuple(sorted((str(k), int(w)) for k, w in weights.items()))), []


def _weight_problem(key: object, weight: object) -> str | None:
    if not isinstance(key, str) or not key:
        return f"fair_weights: each key is a job's rate_key, a non-empty string; got {key!r}"
    if isinstance(weight, bool) or not isinstance(weight, int):
        return f"fair_weights[{key!r}]: must be a whole number of jobs per turn, got {weight!r}"
    if not 1 <= weight <= MAX_WEIGHT:
        return f"fair_weights[{key!r}]: must be from 1 to {MAX_WEIGHT}, got {weight}"
    return None
