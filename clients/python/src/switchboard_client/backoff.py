"""Jittered exponential backoff: each delay is drawn uniformly from [0, min(max, min * 2^n)],
so clients cut off together (a node restart, a shard failover) spread their retries over the
window instead of arriving as one storm."""

from __future__ import annotations

import random
from typing import Callable


class Backoff:
    def __init__(self, min_s: float, max_s: float, factor: float = 2.0,
                 rand: Callable[[], float] = random.random) -> None:
        if min_s <= 0 or max_s < min_s:
            raise ValueError("backoff needs 0 < min_s <= max_s")
        self.min_s = min_s
        self.max_s = max_s
        self.factor = factor
        self.attempts = 0
        self._rand = rand

    def window(self) -> float:
        """Upper bound of the next delay."""
        return min(self.max_s, self.min_s * self.factor ** min(self.attempts, 60))

    def next(self) -> float:
        """Draws the next delay and widens the window."""
        delay = self._rand() * self.window()
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
