"""The decision rules (docs/decisions.md): `table.py` holds them in order, `evidence.py` what they read.

decide(notebook, pod, observations, policy, now) -> Verdict; pure: no I/O, no clock.
"""

from kf_culler.rules.table import RULES, TableEntry, decide, decide_view

__all__ = ["RULES", "TableEntry", "decide", "decide_view"]
