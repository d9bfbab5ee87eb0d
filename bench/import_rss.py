"""What the culler's process holds before it lists anything: the resident size (VmRSS) after each import and after
the Runner is built as `run` builds it (every collaborator; nothing is sent: the kubeconfig names a port nothing
listens on), and which of the kubernetes client's generated API classes that loaded. Each step in a fresh process,
with MALLOC_ARENA_MAX=2 as the image sets it (docs/performance.md, "What the process holds before it lists
anything").

    python3 bench/import_rss.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""

STEPS = {
    "Python alone": "",
    "import kubernetes.client": "import kubernetes.client",
    "import kf_culler.service": "import kf_culler.service",
    "the Runner built (build_runner)": textwrap.dedent("""\
        import kf_culler.service
        from kf_culler.config import load_mapping
        from kf_culler.kube.client import api_client
        from kf_culler.runner import build_runner
        build_runner(load_mapping({}, "bench"), api_client(KUBECONFIG), records_namespace="kf-culler")
        """),
}

MEASURE = textwrap.dedent("""\
    import json, sys
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
    print(json.dumps({"rssMiB": rss / 1024, "apis": sorted(m.rsplit(".", 1)[1] for m in sys.modules
                                                         if m.startswith("kubernetes.client.api."))}))
    """)


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG)
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONPATH": str(root)}
        print(f"{'step':40s} {'RSS, MiB':>9s}  generated API classes loaded")
        for label, code in STEPS.items():
            script = f"KUBECONFIG = {str(kubeconfig)!r}\n{code}\n{MEASURE}"
            out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                 timeout=120, check=True)
            found = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{label:40s} {found['rssMiB']:9.1f}  {', '.join(found['apis']) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
