"""The demo's own mail server and webhook receiver on loopback: where its notices arrive.

An SMTP server (aiosmtpd) and an HTTP server that print one line for each mail or webhook call they
receive, so `kf-culler demo` shows the warning and the stop reaching the notebook's user.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kf_culler.local.procs import free_port

Say = Callable[[str], None]


class Inbox:
    """A loopback SMTP server and webhook receiver; `settings(dir)` is the culler's notifications key."""

    def __init__(self, say: Say) -> None:
        from aiosmtpd.controller import Controller

        self.say = say
        self.mails: list[tuple[list[str], str]] = []
        self.calls: list[dict[str, Any]] = []
        outer = self

        class MailHandler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                mail = message_from_bytes(bytes(envelope.content), policy=default_policy)
                subject = str(mail.get("Subject", ""))
                outer.mails.append((list(envelope.rcpt_tos), subject))
                outer.say(f"   -> mail to {', '.join(envelope.rcpt_tos)}: {subject}")
                return "250 OK"

        class HookHandler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                outer.calls.append(doc if isinstance(doc, dict) else {})
                nb = doc.get("notebook") or {} if isinstance(doc, dict) else {}
                outer.say(f"   -> webhook {doc.get('version', '?')} kind={doc.get('kind')} "
                          f"notebook={nb.get('namespace')}/{nb.get('name')}")
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.smtp = Controller(MailHandler(), hostname="127.0.0.1", port=free_port())
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), HookHandler)
        self._thread = threading.Thread(target=self.http.serve_forever, name="demo-webhooks", daemon=True)

    def start(self) -> Inbox:
        self.smtp.start()
        self._thread.start()
        return self

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.smtp.stop()

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/hook"

    def settings(self, directory: Path) -> dict[str, Any]:
        """The `notifications` configuration that sends to this inbox (the URL from a file, as from a Secret)."""
        url_file = directory / "webhook-demo"
        url_file.write_text(self.webhook_url)
        return {
            "kinds": ["warn", "stop"], "attempts": 2, "backoffSeconds": 0.5,
            "email": {"enabled": True, "host": "127.0.0.1", "port": int(self.smtp.port), "tls": "none",
                      "from": "kf-culler@localhost", "profileOwner": False},
            "webhooks": [{"name": "demo", "format": "generic", "urlFile": str(url_file)}],
        }
