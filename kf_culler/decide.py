"""The public entry point of the decision: `decide(notebook, pod, observations, policy, now) -> Verdict`.

The rules themselves live in kf_culler/rules/ (table.py: the rules in order; evidence.py: what they read).
"""

from __future__ import annotations

from kf_culler.rules import decide, decide_view
from kf_culler.session import MAX_GPUS, gpu_count, server_type

__all__ = ["MAX_GPUS", "decide", "decide_view", "gpu_count", "server_type"]
