"""kf-culler in JupyterLab: the culler's verdict on this notebook as a banner, and a Keep working button.

The server part (handlers.py) asks kf-culler's read-only verdict API with the pod's ServiceAccount token
and serves two routes under the server's base_url; the front-end part (src/index.ts) polls the first and
posts to the second.
"""

from __future__ import annotations

from typing import Any

try:
    from ._version import __version__
except ImportError:  # a source tree that was never built
    __version__ = "0.0.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "kf-culler-jupyterlab"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "kf_culler_jupyterlab"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app.web_app, server_app.log)


# jupyter_server < 2 and notebook 6 look for this name
load_jupyter_server_extension = _load_jupyter_server_extension
