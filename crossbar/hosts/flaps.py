"""Flap damping and quiet logging of one host's health over time.

A host that keeps going down and coming back (a crashing llama-server, a flaky link) would
otherwise attract new conversations every time it returns: it holds the fewest leases, because
it keeps losing them. Like Envoy's outlier ejection, whose ejection time grows with each
ejection, a host that comes back after its second (third, ...) fall within `flap_window` is
held out of new placements for `flap_holddown` times the falls before this one, at most
`flap_holddown_max`. A single fall (a restart) holds nothing. The hold only steers the chooser
(leases/chooser.py): conversations already on the host still go to it.

A host that stays down logs one summary line at most every `DOWN_SUMMARY_EVERY` seconds, so a
dead host is visible in the log without flooding it.
"""

from __future__ import annotations

from collections import deque

from attrs import define, field

DOWN_SUMMARY_EVERY = 60.0  # seconds between "still unhealthy" lines of one host


@define
class Flaps:
    """One host's recent falls (clock seconds), its hold-down, and its down-log pacing."""

    falls: deque[float] = field(factory=deque)
    held_until: float = 0.0
    down_since: float | None = None
    failed_while_down: int = 0  # probes failed since the last summary line
    summarised_at: float = 0.0

    def fell(self, now: float, window: float) -> None:
        """The host became unhealthy at `now`."""
        self.falls.append(now)
        self._forget(now, window)
        self.down_since = now
        self.failed_while_down = 0
        self.summarised_at = now

    def rose(self, now: float, window: float, base: float, most: float) -> float:
        """The host became healthy at `now`: its hold-down (0 for none) in seconds, which
        grows with the falls in the last `window` beyond the first."""
        self._forget(now, window)
        self.down_since = None
        hold = min(most, base * max(0, len(self.falls) - 1))
        self.held_until = now + hold if hold > 0 else 0.0
        return hold

    def held(self, now: float) -> bool:
        """True while the host is held out of new placements."""
        return now < self.held_until

    def recent(self, now: float, window: float) -> int:
        """Falls within the last `window` seconds."""
        return sum(1 for t in self.falls if now - t <= window)

    def still_down(self, now: float) -> bool:
        """Count one more failed probe of a down host; True when a summary line is due."""
        self.failed_while_down += 1
        if now - self.summarised_at >= DOWN_SUMMARY_EVERY:
            self.summarised_at = now
            return True
        return False

    def summary(self, now: float) -> tuple[float, int]:
        """(seconds down, probes failed since the last line), and start counting again."""
        failed, self.failed_while_down = self.failed_while_down, 0
        return now - (self.down_since if self.down_since is not None else now), failed

    def _forget(self, now: float, window: float) -> None:
        while self.falls and now - self.falls[0] > window:
            self.falls.popleft()
