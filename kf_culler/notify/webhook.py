"""A JSON POST to a webhook. The URL (it often carries a token) is read from a file or an environment
variable at each send, so a rotated Secret works, and never appears in an error."""

from __future__ import annotations

import os
from pathlib import Path

import requests

from kf_culler.config import Webhook
from kf_culler.notify import SendError


def url_of(hook: Webhook) -> str:
    try:
        url = Path(hook.url_file).read_text().strip() if hook.url_file else os.environ.get(hook.url_env or "", "")
    except OSError as err:
        raise SendError(f"webhook {hook.name}: cannot read urlFile: {err.strerror}", transient=False) from None
    if not url.startswith(("https://", "http://")):
        raise SendError(f"webhook {hook.name}: no http(s) URL in {'urlFile' if hook.url_file else 'urlEnv'}",
                        transient=False)
    return url


def send(hook: Webhook, body: bytes, timeout: float, session: requests.Session | None = None) -> None:
    """One attempt. 2xx: done; 429 and 5xx and connection problems: transient; other answers: permanent."""
    url = url_of(hook)
    poster = session or requests
    try:
        resp = poster.post(url, data=body, timeout=(min(timeout, 5.0), timeout), allow_redirects=False,
                           headers={"Content-Type": "application/json", "User-Agent": "kf-culler"})
    except requests.RequestException as err:  # the message would carry the URL: name the kind only
        raise SendError(f"webhook {hook.name}: {type(err).__name__}", transient=True) from None
    with resp:
        if 200 <= resp.status_code < 300:
            return
        code = resp.status_code
    raise SendError(f"webhook {hook.name}: HTTP {code}", transient=code == 429 or code >= 500)
