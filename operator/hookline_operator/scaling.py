"""Worker autoscaling by backlog: pure arithmetic, no I/O, unit-tested on its own.

desired = ceil(backlog / targetBacklogPerReplica), clamped to [minReplicas, maxReplicas].
Scaling up happens at once; scaling down goes to the highest recommendation seen in
the last ``scaleDownStabilizationSeconds`` (like the HPA), so a queue that empties
for a moment does not flap. A recommendation of zero needs both an empty backlog
and no in-flight work, so zero is reached only after the whole window was idle.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int = 0
    max_replicas: int = 10
    target_backlog_per_replica: int = 100
    scale_down_stabilization_seconds: float = 300.0

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ScalePolicy:
        workers = spec.get("workers") or {}
        return cls(
            min_replicas=int(workers.get("minReplicas", 0)),
            max_replicas=int(workers.get("maxReplicas", 10)),
            target_backlog_per_replica=max(1, int(workers.get("targetBacklogPerReplica", 100))),
            scale_down_stabilization_seconds=float(workers.get("scaleDownStabilizationSeconds", 300)),
        )


def recommend(backlog: int, in_flight: int, policy: ScalePolicy) -> int:
    """Replicas this instant's load asks for."""
    if backlog <= 0 and in_flight <= 0:
        wanted = 0
    else:
        wanted = max(1, math.ceil(max(backlog, 0) / policy.target_backlog_per_replica))
    return max(policy.min_replicas, min(policy.max_replicas, wanted))


@dataclass
class Stabilizer:
    """Remembers recent recommendations of one provider."""

    history: deque[tuple[float, int]] = field(default_factory=deque)

    def desired(self, now: float, recommendation: int, current: int, policy: ScalePolicy) -> int:
        if not self.history:
            # After a restart we know nothing of the last window: count the current
            # replicas as a recommendation, so we never scale down before a full window.
            self.history.append((now, current))
        self.history.append((now, recommendation))
        while self.history and self.history[0][0] < now - policy.scale_down_stabilization_seconds:
            self.history.popleft()
        if recommendation >= current:
            return recommendation
        return max(policy.min_replicas, min(policy.max_replicas, max(r for _, r in self.history)))
