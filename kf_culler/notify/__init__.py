"""Notices of warnings and stops, by email and webhook, sent off the pass's thread (docs/notifications.md)."""

from __future__ import annotations


class SendError(Exception):
    """A delivery that failed. `transient`: worth another attempt (timeouts, 4xx SMTP, 429/5xx HTTP).

    The message never carries a webhook URL or a password: it is shown in metrics, logs, Events and
    `kf-culler explain`.
    """

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient
