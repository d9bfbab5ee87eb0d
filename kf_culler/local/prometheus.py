"""A real Prometheus on loopback, and small stand-in exporters for it to scrape.

`Prometheus` starts the `prometheus` binary on PATH (hack/setup.sh installs the Debian package) on a
free 127.0.0.1 port with a temporary configuration and TSDB directory, and removes both when stopped.
`StubServer` is a threaded HTTP server on 127.0.0.1 that answers from a callable: the stand-in
dcgm-exporter, cAdvisor or Istio endpoints that Prometheus scrapes, or a fake Prometheus API (a 503, a
bearer-token check). `dcgm_exposition` writes dcgm-exporter's text format.

Used by the tests, the demo and the benchmarks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from kf_culler.local import procs


class Unavailable(RuntimeError):
    """Prometheus is not installed here; the message says what to run."""


class StartFailed(RuntimeError):
    """Prometheus is installed but did not start: a failure wherever it happens, never a skip."""


SETUP_HINT = "install it with `bash hack/setup.sh` (Debian: apt-get install -y --no-install-recommends prometheus)"


def find_prometheus() -> str:
    """The path of the `prometheus` binary on PATH; Unavailable, saying what to run, when there is none."""
    found = shutil.which("prometheus")
    if not found:
        raise Unavailable(f"prometheus is not on PATH: {SETUP_HINT}")
    return found


# -- stand-in HTTP endpoints ---------------------------------------------------------------------

@dataclass
class Seen:
    """One request a StubServer answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Reply = tuple[int, str, bytes]  # status, content type, body
Handler = Callable[[Seen], Reply]


class StubServer:
    """A threaded HTTP/1.0 server on 127.0.0.1 (one request per connection: no keep-alive stalls)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with outer._lock:
                    outer.seen.append(seen)
                try:
                    status, ctype, payload = outer.handler(seen)
                except Exception as err:  # a broken stand-in answers 500, it does not hang
                    status, ctype, payload = 500, "text/plain", f"{type(err).__name__}: {err}".encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a scrape timed out, a server stopped)

            do_GET = _serve
            do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name=f"stub-{self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def text_reply(text: str, status: int = 200) -> Reply:
    return status, "text/plain; version=0.0.4; charset=utf-8", text.encode()


def json_reply(doc: Any, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(doc).encode()


class Exposition:
    """A /metrics endpoint whose text can be replaced while Prometheus scrapes it."""

    def __init__(self, text: str = "") -> None:
        self._text = text
        self._lock = threading.Lock()
        self.stub = StubServer(self._handle)

    def set(self, text: str) -> None:
        with self._lock:
            self._text = text

    def _handle(self, seen: Seen) -> Reply:
        if not seen.path.startswith("/metrics"):
            return text_reply("not found\n", 404)
        with self._lock:
            return text_reply(self._text)

    def __enter__(self) -> Exposition:
        self.stub.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stub.stop()


# -- dcgm-exporter's text format -----------------------------------------------------------------

# HELP texts and types as in dcgm-exporter's etc/default-counters.csv and etc/dcp-metrics-included.csv.
DCGM_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
}


@dataclass
class FakeGpu:
    """One GPU as dcgm-exporter reports it, optionally assigned to a pod."""

    index: int
    uuid: str
    util: float = 0.0
    used_mib: float = 0.0
    total_mib: float = 81920.0
    engine_active: float | None = None
    namespace: str = ""
    pod: str = ""
    container: str = ""
    hostname: str = "gpu-node-1"
    model: str = "NVIDIA A100-SXM4-80GB"
    extra: dict[str, str] = field(default_factory=dict)

    def labels(self) -> str:
        pairs = [("gpu", str(self.index)), ("UUID", self.uuid),
                 ("pci_bus_id", f"00000000:{self.index + 7:02X}:00.0"), ("device", f"nvidia{self.index}"),
                 ("modelName", self.model), ("Hostname", self.hostname),
                 ("DCGM_FI_DRIVER_VERSION", "550.54.15"),
                 ("container", self.container), ("namespace", self.namespace), ("pod", self.pod)]
        pairs.extend(self.extra.items())
        return ",".join(f'{k}="{v}"' for k, v in pairs)


def dcgm_exposition(gpus: Iterable[FakeGpu]) -> str:
    """dcgm-exporter's /metrics text for these GPUs (HELP and TYPE once per family, then one line per GPU)."""
    gpus = list(gpus)
    values: dict[str, Callable[[FakeGpu], float | None]] = {
        "DCGM_FI_DEV_GPU_UTIL": lambda g: g.util,
        "DCGM_FI_DEV_FB_FREE": lambda g: g.total_mib - g.used_mib,
        "DCGM_FI_DEV_FB_USED": lambda g: g.used_mib,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda g: g.engine_active,
    }
    lines: list[str] = []
    for name, value_of in values.items():
        rows = [(g, value_of(g)) for g in gpus]
        rows = [(g, v) for g, v in rows if v is not None]
        if not rows:
            continue
        kind, text = DCGM_HELP[name]
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        for g, v in rows:
            lines.append(f"{name}{{{g.labels()}}} {v:g}")
    return "\n".join(lines) + "\n"


def flood_exposition(namespace: str, gpus: int, prefix: str = "flood", hostname: str = "flood-node") -> str:
    """dcgm-exporter-shaped text claiming `gpus` idle GPUs in `namespace`, one pod `<prefix>-NNNNN-0` each:
    two series per GPU (utilisation and memory used, the two a GPU source must read), short labels, so
    a stand-in exporter can serve tens of thousands of series to a real Prometheus (series-flood tests)."""
    lines: list[str] = []
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        kind, text = DCGM_HELP[name]
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f'{name}{{gpu="0",UUID="GPU-{prefix}-{i:05d}",Hostname="{hostname}",'
                     f'namespace="{namespace}",pod="{prefix}-{i:05d}-0"}} 0' for i in range(gpus))
    return "\n".join(lines) + "\n"


def labelled_exposition(metric: str, labels: dict[str, str], value: float) -> str:
    """One sample line with exactly these labels (no HELP/TYPE): a hand-made series, e.g. one whose
    pod labels are ambiguous, to append to a `dcgm_exposition`."""
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{pairs}}} {value:g}\n"


# -- Prometheus itself ---------------------------------------------------------------------------

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(duration: str) -> float:
    """A one-unit Prometheus duration ("500ms", "2s", "1m") in seconds."""
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[:-len(unit)].isdigit():
            return int(duration[:-len(unit)]) * _DURATION_UNITS[unit]
    raise ValueError(f"not a one-unit Prometheus duration: {duration!r}")


def scrape_timeout_for(interval: str) -> str:
    """Three quarters of the scrape interval: a scrape slowed down by a loaded machine still completes
    (a timeout equal to the interval leaves none), and it ends before the next one is due."""
    return f"{int(_seconds(interval) * 750)}ms"


class Prometheus:
    """One Prometheus process on 127.0.0.1 with a temporary config and TSDB, removed on stop.

    It scrapes every 2 s with a 1.5 s timeout by default: on a loaded 2-core machine a stand-in exporter
    can take well over the few milliseconds it usually needs, and a timed-out scrape is a missing sample.
    """

    def __init__(self, scrape_configs: Sequence[dict[str, Any]], scrape_interval: str = "2s",
                 web_config: dict[str, Any] | None = None, binary: str | None = None,
                 retention: str = "2h", scrape_timeout: str | None = None) -> None:
        self.binary = binary or find_prometheus()
        self.scrape_configs = list(scrape_configs)
        self.scrape_interval = scrape_interval
        self.scrape_timeout = scrape_timeout or scrape_timeout_for(scrape_interval)
        if _seconds(self.scrape_timeout) > _seconds(scrape_interval):
            raise ValueError(f"scrape timeout {self.scrape_timeout} exceeds the interval {scrape_interval}")
        self.web_config = web_config
        self.retention = retention
        self.dir: Path | None = None
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.web_config and "tls_server_config" in self.web_config else "http"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("Prometheus is not started")
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Prometheus:
        self.dir = Path(tempfile.mkdtemp(prefix="kfc-prom-"))
        (self.dir / "data").mkdir()
        config = {"global": {"scrape_interval": self.scrape_interval,
                             "scrape_timeout": self.scrape_timeout,
                             "evaluation_interval": "1m"},
                  "scrape_configs": self.scrape_configs}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = procs.free_port()
        cmd = [self.binary, f"--config.file={self.dir / 'prometheus.yml'}",
               f"--storage.tsdb.path={self.dir / 'data'}",
               f"--storage.tsdb.retention.time={self.retention}",
               f"--web.listen-address=127.0.0.1:{self.port}",
               "--log.level=warn"]
        if self.web_config is not None:
            (self.dir / "web.yml").write_text(yaml.safe_dump(self.web_config, sort_keys=False))
            cmd.append(f"--web.config.file={self.dir / 'web.yml'}")
        self.proc = procs.start(cmd, self.dir / "prometheus.log", cwd=self.dir)
        try:
            procs.wait_until(self._ready, timeout, interval=0.2, what="Prometheus /-/ready")
        except TimeoutError as err:
            log = self.log()
            self.stop()
            raise StartFailed(f"{err}; log:\n{log}") from None
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise StartFailed(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
        try:
            ctx = None
            if self.scheme == "https":
                import ssl

                ctx = ssl._create_unverified_context()
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log(self) -> str:
        return procs.tail(self.dir / "prometheus.log") if self.dir else "(not started)"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query through the plain HTTP API (for tests waiting on data)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        ctx = None
        if self.scheme == "https":
            import ssl

            ctx = ssl._create_unverified_context()
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            doc = json.loads(resp.read())
        result = doc.get("data", {}).get("result", [])
        return result if isinstance(result, list) else []

    def wait_for(self, expr: str, count: int = 1, timeout: float = 60.0) -> None:
        """Poll until `expr` returns at least `count` series."""
        def enough() -> bool:
            try:
                return len(self.query(expr)) >= count
            except (OSError, ValueError):
                return False

        procs.wait_until(enough, timeout, interval=0.25, what=f"{count} series of {expr}")

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def static_job(name: str, targets: Sequence[str], honor_labels: bool = False,
               labels: dict[str, str] | None = None, scheme: str = "http") -> dict[str, Any]:
    """A scrape job for fixed loopback targets."""
    group: dict[str, Any] = {"targets": list(targets)}
    if labels:
        group["labels"] = dict(labels)
    return {"job_name": name, "honor_labels": honor_labels, "scheme": scheme, "metrics_path": "/metrics",
            "static_configs": [group]}
