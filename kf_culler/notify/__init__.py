"""Notices of warnings and stops, by email and webhook, sent off the pass's thread (docs/notifications.md)."""

from __future__ import annotations

from kf_culler.errors import SendError as SendError
