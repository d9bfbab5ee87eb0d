"""What every cluster command shares (the culler's namespace) and what each says for itself (its exit codes), and
the shipped manifests' configuration started by `kf-culler run` against a real API server."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from support.target import KubeTarget

from kf_culler.cli import EXIT_CODES, build_parser
from kf_culler.kube.brakes import NAME as BRAKES
from kf_culler.kube.client import DEFAULT_NAMESPACE, culler_namespace
from kf_culler.local import objects as obj

CLUSTER_COMMANDS = ("check", "explain", "run", "release-brakes")


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _help(command: str) -> str:
    return _commands()[command].format_help()


# --- the culler's namespace ---------------------------------------------------------------------------------------


def test_the_cullers_namespace_the_flag_then_pod_namespace_then_the_service_account_then_kubeflow(
        tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    absent = tmp_path / "absent"
    sa.write_text("from-service-account\n")
    assert culler_namespace("given", {"POD_NAMESPACE": "from-env"}, sa) == "given"
    assert culler_namespace(None, {"POD_NAMESPACE": "from-env"}, sa) == "from-env"
    assert culler_namespace(None, {}, sa) == "from-service-account"
    assert culler_namespace(None, {"POD_NAMESPACE": ""}, absent) == DEFAULT_NAMESPACE == "kubeflow"
    sa.write_text("")
    assert culler_namespace(None, {}, sa) == "kubeflow"


def test_every_cluster_command_documents_the_same_namespace_default() -> None:
    helps = {c: " ".join(_help(c).split()) for c in CLUSTER_COMMANDS}
    for command, text in helps.items():
        assert "--culler-namespace NAMESPACE" in text, command
        assert "else the namespace of the pod's ServiceAccount, else kubeflow" in text, command
        assert "else default" not in text, command


def test_release_brakes_and_check_use_the_same_namespace_from_pod_namespace(kube: KubeTarget, api: Any,
                                                                           namespace: str) -> None:
    """`release-brakes` writes its ConfigMap where `check` reads the record: both from POD_NAMESPACE (once
    `release-brakes` defaulted to kubeflow and `check` to default)."""
    env = {**os.environ, "POD_NAMESPACE": namespace}
    done = subprocess.run([sys.executable, "-m", "kf_culler", "release-brakes", "--kubeconfig", str(kube.kubeconfig)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"ConfigMap {namespace}/{BRAKES}" in done.stdout
    assert client.CoreV1Api(api).read_namespaced_config_map(BRAKES, namespace).data


def test_check_compare_config_shows_the_other_verdict_from_the_same_pass(kube: KubeTarget, api: Any, namespace: str,
                                                                         tmp_path: Path) -> None:
    """`check --compare-config FILE` against a real API server: the notebook's probe fails (no IDE behind it), so
    today's defaults keep it for no signal; the other file's start-up grace of 10 hours keeps it as starting. Both
    verdicts come from one pass, and the row says they differ."""
    other = tmp_path / "recommended.yaml"
    other.write_text("startupGraceMinutes: 600\n")
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=3))
    done = subprocess.run([sys.executable, "-m", "kf_culler", "check", "--kubeconfig", str(kube.kubeconfig),
                           "--culler-namespace", namespace, "--compare-config", str(other), "-o", "json"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    [row] = [r for r in doc["notebooks"] if r["namespace"] == namespace]
    assert doc["compared"] == str(other)
    assert row["current"]["state"] == "no-signal" and row["current"]["action"] == "keep"
    assert row["compared"]["state"] == "starting" and row["compared"]["rule"] == "3-starting"
    assert row["differs"] is True


# --- --help: each command's own exit codes -------------------------------------------------------------------------


def test_each_commands_help_shows_only_its_own_exit_codes() -> None:
    """Each command's --help ends with its own exit codes and nothing of another command's."""
    commands = _commands()
    assert set(commands) == set(EXIT_CODES) - {"kf-culler"}
    texts = {c: p.format_help() for c, p in commands.items()}
    for command, text in texts.items():
        codes = text.split("exit codes:\n", 1)[1]
        assert codes.split() == EXIT_CODES[command].split(), command
        assert "decide: a verdict was printed" not in text and "check: the pass completed" not in text, command
    assert len({t.split("exit codes:", 1)[1] for t in texts.values()}) == len(texts)
    assert "130" in texts["demo"] and "130" not in texts["check"]
    assert "the verdict was printed" in texts["decide"] and "the verdict was printed" not in texts["run"]
    assert "COMMAND --help" in build_parser().format_help()


# --- the rendered ConfigMap started by `kf-culler run` -------------------------------------------------------------


def _rendered(tmp_path: Path) -> list[dict[str, Any]]:
    """overlays/dry-run + components/istio-policies + components/workspaces, as an admin's kustomization."""
    from test_kustomize import render_admin

    return render_admin(tmp_path, "dry-run", ("istio-policies", "workspaces"))


def test_run_once_starts_with_the_rendered_configmap_and_names_a_bad_fragment(kube: KubeTarget, api: Any,
                                                                             namespace: str, tmp_path: Path) -> None:
    """The rendered ConfigMap's files, written where the rendered Deployment mounts them, and the Deployment's own
    `--config`: `kf-culler run --once --dry-run` starts, loads the admin's file with the components' fragments and
    passes over the cluster writing nothing; the same files with a broken fragment stop it with exit code 2 and a
    message naming that fragment and the key."""
    from test_kustomize import cli_args, config_files

    objs = _rendered(tmp_path)
    files = config_files(objs)
    assert set(files) == {"config.yaml", "istio-policies.fragment.yaml", "workspaces.fragment.yaml"}
    config = Path(cli_args(objs).config)
    mount = tmp_path / "mount" / config.parent.relative_to("/")
    mount.mkdir(parents=True)
    for name, text in files.items():
        (mount / name).write_text(text)
    # Workspaces need their CRD, which this API server does not serve: the admin's targets only, plus the others'
    # sections; everything else is the rendered files as they are.
    (mount / "workspaces.fragment.yaml").unlink()
    obj.create_notebook(api, namespace, obj.notebook("nb"))
    obj.running_pod(api, namespace, "nb", datetime.now(UTC) - timedelta(hours=3))
    command = [sys.executable, "-m", "kf_culler", "run", "--once", "--dry-run", "--text-logs",
               "--kubeconfig", str(kube.kubeconfig), "--culler-namespace", namespace,
               "--config", str(mount / config.name)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    nb = client.CustomObjectsApi(api).get_namespaced_custom_object("kubeflow.org", "v1", namespace, "notebooks", "nb")
    assert "kubeflow-resource-stopped" not in (nb["metadata"].get("annotations") or {})

    fragment = yaml.safe_load(files["istio-policies.fragment.yaml"])
    fragment["istio"]["reconcileEveryPasses"] = "often"
    (mount / "istio-policies.fragment.yaml").write_text(yaml.safe_dump(fragment))
    bad = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "istio-policies.fragment.yaml: key 'istio.reconcileEveryPasses'" in bad.stderr


def test_the_rendered_dry_run_configuration_with_components_is_dry_run(tmp_path: Path) -> None:
    """The rendered files of the same kustomization, loaded as `run` loads them: dryRun is the dry-run overlay's."""
    from test_kustomize import mounted_settings

    settings = mounted_settings(_rendered(tmp_path), tmp_path / "m")
    assert settings.operations.dry_run is True
    assert settings.operations.istio.manage_authorization_policies
    assert settings.operations.targets == ("notebooks", "workspaces")


def test_the_kf_culler_commands_in_install_md_parse_and_check_reads_the_mounted_configuration() -> None:
    """Every `kf-culler` command line in docs/install.md's shell blocks parses with the culler's own parser as
    written, and each `check` or `explain` given there names the configuration the culler runs with."""
    import re
    import shlex

    text = (Path(__file__).resolve().parents[1] / "docs" / "install.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    commands = [shlex.split(m.group(1)) for line in lines if (m := re.search(r"(?:^|-- )kf-culler ([a-z].*)$", line))]
    assert {c[0] for c in commands} >= {"check", "explain", "release-brakes"}
    for argv in commands:
        args = build_parser().parse_args(argv)  # SystemExit(2) on anything the parser refuses
        if args.command in ("check", "explain"):
            assert args.config == "/etc/kf-culler/config.yaml", argv
