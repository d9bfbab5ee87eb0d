"""Replay: try a policy on a fleet's trace before turning it on (see docs/replay.md).

trace     the JSON Lines trace format (reader and writer)
recorder  TraceRecorder, which `kf-culler run --record FILE` uses to append what the culler observed
fleet     a seeded synthetic fleet with named behaviours and ground truth
rules     the compared rules: a policy through the real `decide`, and two reference rules
simulate  the replay itself; report and plot present its result
"""

from kf_culler.replay.recorder import TraceRecorder
from kf_culler.replay.trace import Record, TraceError, TraceHeader, read_trace

__all__ = ["Record", "TraceError", "TraceHeader", "TraceRecorder", "read_trace"]
