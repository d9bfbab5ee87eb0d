"""Command line: argument parsing and one function per subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kf_culler.config import Settings
    from kf_culler.runner import Runner

from kf_culler import __version__

# Each command's exit codes, shown at the end of its --help (argparse exits 2 on a bad argument for every command).
EXIT_CODES = {
    "kf-culler": "exit codes: each command's own, in `kf-culler COMMAND --help`; 2 for a bad argument everywhere",
    "decide": "0  the verdict was printed\n"
              "2  bad input: the scenario cannot be read, or it or its configuration is invalid (the message names "
              "the key)",
    "check": "0  the pass completed and the table was printed\n"
             "1  no Kubernetes credentials, or the notebooks could not be listed within --timeout (the API server "
             "unreachable, the Notebook CRD missing)\n"
             "2  bad configuration (the message names the file and the key) or argument",
    "explain": "0  the session's evidence and verdict were printed\n"
               "1  no Kubernetes credentials, the notebooks could not be listed within --timeout, the session was "
               "not found, or the configuration does not select it\n"
               "2  bad configuration (the message names the file and the key), or not NAMESPACE/NAME",
    "run": "0  stopped by SIGTERM or SIGINT (with --once: the pass completed)\n"
           "1  no Kubernetes credentials, or a component failed to start\n"
           "2  bad configuration (the message names the file and the key) or argument",
    "release-brakes": "0  the brakes' ConfigMap was written: the culler's next pass ends the hold\n"
                      "1  the ConfigMap could not be written (credentials, rights, the API server)\n"
                      "2  bad argument",
    "demo": "0  the demo ran to its end\n"
            "1  a local component failed (the message says which)\n"
            "2  the demo extra is not installed (the message says how to install it)\n"
            "130  interrupted (Ctrl-C)",
    "fleet": "0  the trace was written (or the behaviours listed)\n"
             "1  the trace could not be written\n"
             "2  a bad argument (--start, --mix, ...)",
    "replay": "0  the report was printed\n"
              "1  a plot was asked for without matplotlib\n"
              "2  a bad trace, policy file, --grid or --timeline",
    "convert": "0  the trace was written\n"
               "1  the trace could not be written\n"
               "2  the template cannot be read (the message names the key) or a bad argument",
}


def _epilog(command: str) -> str:
    codes = EXIT_CODES[command]
    return codes + "\n" if command == "kf-culler" else "exit codes:\n" + "".join(
        f"  {line}\n" for line in codes.splitlines())


def cmd_decide(args: argparse.Namespace) -> int:
    from kf_culler.config import ConfigError
    from kf_culler.model import InputError
    from kf_culler.scenario import verdict_for_text

    source = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as err:
        print(f"kf-culler decide: {source}: cannot read: {err}", file=sys.stderr)
        return 2
    try:
        verdict = verdict_for_text(text, source)
    except (InputError, ConfigError) as err:
        print(f"kf-culler decide: {err}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_dict(), indent=None if args.compact else 2))
    return 0


def _settings(args: argparse.Namespace) -> Settings | None:
    from kf_culler.config import ConfigError, load_mapping
    from kf_culler.config_layers import load_layered

    try:
        settings = load_layered(args.config) if args.config else load_mapping({}, "defaults")
    except ConfigError as err:
        print(f"kf-culler {args.command}: {err}", file=sys.stderr)
        return None
    return settings


def _runner(args: argparse.Namespace, settings: Settings) -> Runner | None:
    from kf_culler.kube.client import api_client, culler_namespace
    from kf_culler.runner import build_runner

    try:
        api = api_client(args.kubeconfig)
    except Exception as err:
        print(f"kf-culler {args.command}: cannot load Kubernetes credentials: {err}", file=sys.stderr)
        return None
    return build_runner(settings, api, one_off=args.command != "run", dry_run=bool(vars(args).get("dry_run")),
                        records_namespace=culler_namespace(args.culler_namespace))


def _synced_runner(args: argparse.Namespace) -> Runner | int:
    """A runner whose notebook cache has synced, or the exit code that says why there is none."""
    settings = _settings(args)
    if settings is None:
        return 2
    runner = _runner(args, settings)
    if runner is None:
        return 1
    cache = runner.start_cache(timeout=args.timeout)
    if not cache.synced:
        cache.close()
        print(f"kf-culler {args.command}: could not list notebooks within {args.timeout:g} s "
              f"(is the API server reachable and the Notebook CRD installed?)", file=sys.stderr)
        return 1
    return runner


def _with_long_stopped(runner: Runner, fmt: str, text: str) -> str:
    """`check`'s output with the notebooks stopped longer than longStoppedDays (after the table)."""
    from datetime import UTC, datetime

    from kf_culler.report import with_long_stopped
    from kf_culler.stopped import long_stopped_in

    notebooks = [nb for nb, _ in runner.cache.snapshot()] if runner.cache is not None else []
    found = long_stopped_in(runner.settings, notebooks, datetime.now(UTC), runner.policy_of)
    return with_long_stopped(text, fmt, found, runner.settings.operations.long_stopped_days)


def cmd_check(args: argparse.Namespace) -> int:
    from kf_culler.report import render
    from kf_culler.rule_check import loosening_rule_warnings

    other = None
    if args.compare_config:
        from kf_culler.config import ConfigError
        from kf_culler.config_layers import load_layered

        try:
            other = load_layered(args.compare_config)
        except ConfigError as err:
            print(f"kf-culler check: --compare-config: {err}", file=sys.stderr)
            return 2
        except OSError as err:
            print(f"kf-culler check: --compare-config {args.compare_config}: {err.strerror or err}", file=sys.stderr)
            return 2
    runner = _synced_runner(args)
    if isinstance(runner, int):
        return runner
    warning = runner.settings.gpu_source_warning()
    warnings = ([warning] if warning else []) + loosening_rule_warnings(runner.settings)
    try:
        if other is None:
            print(_with_long_stopped(runner, args.output, render(runner.once(), args.output, warnings)))
        else:
            print(_compared(runner, other, args.compare_config, args.output, warnings))
    finally:
        runner.close()
    return 0


def _compared(runner: Runner, other: Settings, path: str, fmt: str, warnings: list[str]) -> str:
    """`check --compare-config`: one pass, and each of its notebooks decided again with `other`."""
    from kf_culler import compare_verdicts

    result = runner.once()
    rows = compare_verdicts.compare(result, result.items, runner.build_cycle(), other, runner.namespace_labels)
    return compare_verdicts.render(rows, result, fmt, path,
                                   [*warnings, *compare_verdicts.warnings_for(runner.settings, other, path)])


def cmd_explain(args: argparse.Namespace) -> int:
    from kf_culler.report import explain
    from kf_culler.targets import SessionKey, session_key

    key = SessionKey.parse(args.notebook)
    if key is None:
        print("kf-culler explain: give the notebook as NAMESPACE/NAME (another target's session as "
              "NAMESPACE/Workspace/NAME, NAMESPACE/Deployment/NAME, ...)", file=sys.stderr)
        return 2
    ns, name = key
    runner = _synced_runner(args)
    if isinstance(runner, int):
        return runner
    try:
        items = [(nb, pod) for nb, pod in runner.cache.snapshot() + runner.coder_items()[0]
                 if session_key(nb) == key]
        if not items:
            print(f"kf-culler explain: notebook {ns}/{name} not found", file=sys.stderr)
            return 1
        result = runner.build_cycle().run(items)
    finally:
        runner.close()
    if not result.results:
        print(f"kf-culler explain: {ns}/{name} is not selected by the configuration "
              "(namespaces.include/exclude or gpuOnly)", file=sys.stderr)
        return 1
    print(explain(result.results[0], _notifications(runner, ns, name)))
    return 0


def _notifications(runner: Runner, ns: str, name: str) -> str:
    """The explain line for notices: off, or the last failed delivery (a NotificationFailed Event)."""
    if not runner.settings.operations.notifications.enabled:
        return "off"
    from kf_culler.notify.notifier import last_failure

    try:
        failed = last_failure(runner.api, ns, name)
    except Exception as err:
        return f"could not read the notebook's Events ({type(err).__name__})"
    return f"last failure {failed}" if failed else "no failed delivery recorded"


def cmd_run(args: argparse.Namespace) -> int:
    from kf_culler.kube.client import api_client, culler_namespace
    from kf_culler.service import Options, serve

    settings = _settings(args)
    if settings is None:
        return 2
    try:
        api = api_client(args.kubeconfig)
    except Exception as err:
        print(f"kf-culler run: cannot load Kubernetes credentials: {err}", file=sys.stderr)
        return 1
    namespace = culler_namespace(args.culler_namespace)
    return serve(settings, api, Options(
        once=args.once, metrics_address=args.metrics_address, api_address=args.api_address,
        leader_elect=args.leader_elect, lease_namespace=args.lease_namespace or namespace,
        lease_name=args.lease_name, record=args.record, record_hash_key=args.record_hash_key,
        record_segment_hours=args.record_segment_hours, record_max_mb=args.record_max_mb,
        json_logs=not args.text_logs, dry_run=args.dry_run,
        records_namespace=namespace))


def cmd_release_brakes(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from kf_culler.kube.brakes import NAME, release
    from kf_culler.kube.client import api_client, culler_namespace

    namespace = culler_namespace(args.culler_namespace)
    try:
        release(api_client(args.kubeconfig), namespace, datetime.now(UTC))
    except Exception as err:
        print(f"kf-culler release-brakes: cannot write ConfigMap {namespace}/{NAME}: {err}", file=sys.stderr)
        return 1
    print(f"released: the culler's next pass ends the brakes' hold (ConfigMap {namespace}/{NAME})")
    return 0


# What `kf-culler demo` needs beyond the runtime dependencies: its local components (not in the container
# image) and the `demo` extra (pyproject.toml). Looked up, not imported: Jupyter runs in a subprocess.
DEMO_MODULES = ("kf_culler.local", "cryptography", "jupyter_server", "jupyter_server_terminals", "ipykernel",
                "jupyter_client")
DEMO_INSTALL = "pip install -e '.[demo]' (from a source checkout; or pip install 'kf-culler[demo]')"


def missing_demo_modules() -> list[str]:
    import importlib.util

    missing = []
    for name in DEMO_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # ValueError: blocked with sys.modules[name] = None
            found = None
        if found is None:
            missing.append(name)
    return missing


def demo_unavailable(missing: Sequence[str]) -> int:
    print(f"kf-culler demo needs the demo extra, and {', '.join(missing)} cannot be imported: {DEMO_INSTALL}",
          file=sys.stderr)
    return 2


def cmd_demo(args: argparse.Namespace) -> int:
    missing = missing_demo_modules()
    if missing:
        return demo_unavailable(missing)
    try:
        from kf_culler.local.cluster import ClusterError
    except ImportError as err:
        return demo_unavailable([err.name or str(err)])

    try:
        if args.gpu:
            from kf_culler.demo_gpu import run_gpu_demo

            return run_gpu_demo(sys.stdout)
        if args.target == "workspaces":
            from kf_culler.demo_workspaces import run_workspaces_demo

            return run_workspaces_demo(sys.stdout)
        from kf_culler.demo import run_demo

        return run_demo(sys.stdout, idle_seconds=args.idle_seconds, warn_seconds=args.warn_seconds)
    except ClusterError as err:
        print(f"kf-culler demo: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def cmd_fleet(args: argparse.Namespace) -> int:
    from kf_culler.replay.commands import fleet_command

    return fleet_command(notebooks=args.notebooks, days=args.days, seed=args.seed, out=args.out,
                         check_minutes=args.check_minutes, start=args.start, mix=args.mix,
                         gpu_lookback_minutes=args.gpu_lookback, gpu_step_minutes=args.gpu_step,
                         list_behaviours=args.list_behaviours)


def cmd_replay(args: argparse.Namespace) -> int:
    from kf_culler.replay.commands import replay_command

    if args.sweep:
        from kf_culler.replay.sweep_commands import sweep_command

        if args.compare or args.timeline:
            print("kf-culler replay: --sweep compares the grid's policies; --compare and --timeline go without it",
                  file=sys.stderr)
            return 2
        return sweep_command(trace=args.trace, config=args.config, grid=args.grid or [], per=args.per,
                             max_restarts=args.max_restarts_per_session_day, jobs=args.jobs, plot=args.plot,
                             write_config=args.write_config, output_format=args.format,
                             restart_delay_minutes=args.restart_delay, check_period_minutes=args.check_period,
                             bound_gpu_hours=args.bound_gpu_hours)
    return replay_command(trace=args.trace, config=args.config, compare=args.compare or [], plot=args.plot,
                          timeline=args.timeline, timeline_plot=args.timeline_plot,
                          restart_delay_minutes=args.restart_delay, check_period_minutes=args.check_period,
                          oracle_idle_minutes=args.oracle_idle, output_format=args.format,
                          max_list=args.max_list)


def cmd_convert(args: argparse.Namespace) -> int:
    from kf_culler.replay.sweep_commands import convert_command

    return convert_command(template=args.template, out=args.out, namespace=args.namespace, start=args.start,
                           check_minutes=args.check_minutes, until_hours=args.until_hours)


def _namespace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--culler-namespace", metavar="NAMESPACE", default=None,
                   help="the culler's own namespace: its record of notebooks (ConfigMaps kf-culler-records-*), the "
                   "brakes' ConfigMap kf-culler-brakes, its Leases (default: POD_NAMESPACE, else the namespace of the "
                   "pod's ServiceAccount, else kubeflow)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE",
                   help="configuration YAML, with the *.fragment.yaml files beside it merged in "
                   "(docs/configuration.md, \"Fragments\"; default: built-in defaults)")
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig to use (default: in-cluster service account, else ~/.kube/config)")
    _namespace_arg(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kf-culler",
        description="Idle culler for Kubeflow Notebooks: reads Jupyter, code-server, RStudio and GPU signals "
        "and stops idle notebooks through kubeflow-resource-stopped, saying why.",
        epilog=_epilog("kf-culler"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kf-culler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("decide", help="decide one scenario file (see docs/decisions.md) and print the verdict",
                       epilog=_epilog("decide"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", required=True, metavar="FILE|-", help="scenario JSON, or - for stdin")
    p.add_argument("--compact", action="store_true", help="print the verdict on one line")
    p.set_defaults(func=cmd_decide)

    p = sub.add_parser("check", help="one pass over the cluster, writing nothing; prints a table",
                       epilog=_epilog("check"), formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_args(p)
    p.add_argument("--output", "-o", choices=("table", "wide", "json", "yaml"), default="table")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the notebook list")
    p.add_argument("--compare-config", metavar="FILE",
                   help="also decide every notebook with this configuration (e.g. the config.yaml `replay --sweep "
                   "--write-config` wrote; read with the *.fragment.yaml beside it, as `run --config` reads it), "
                   "from the same evidence, and show its verdict beside today's (`*`: it differs)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("explain", help="every source's answer for one notebook, and the rule that decided",
                       epilog=_epilog("explain"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebook", metavar="NAMESPACE/NAME",
                   help="a Notebook; another target's session as NAMESPACE/Workspace/NAME, NAMESPACE/Deployment/NAME "
                   "or NAMESPACE/StatefulSet/NAME (docs/targets.md)")
    _cluster_args(p)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the notebook list")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("run", help="the culler: a pass every checkPeriodSeconds until SIGTERM",
                       epilog=_epilog("run"), formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_args(p)
    p.add_argument("--dry-run", action="store_true", help="decide and report, write nothing")
    p.add_argument("--once", action="store_true", help="run one pass and exit")
    p.add_argument("--metrics-address", metavar="HOST:PORT",
                   help="serve /metrics, /healthz and /readyz here (e.g. 0.0.0.0:9090)")
    p.add_argument("--api-address", metavar="HOST:PORT",
                   help="serve the read-only verdict API /api/v1/ here (e.g. 0.0.0.0:9091; docs/verdict-api.md)")
    p.add_argument("--leader-elect", action="store_true",
                   help="hold a coordination.k8s.io Lease; only the holder writes")
    p.add_argument("--lease-namespace", default=None,
                   help="namespace of the Lease (default: the culler's namespace, --culler-namespace)")
    p.add_argument("--lease-name", default="kf-culler")
    p.add_argument("--record", metavar="FILE|DIR/",
                   help="append what the culler observed to a replay trace; a directory (existing, or ending in /) "
                   "gets gzip segments, rotated and bounded on disk (docs/replay.md, \"Recording a real fleet\")")
    p.add_argument("--record-segment-hours", type=float, default=24, metavar="H",
                   help="with --record DIR/: begin a new segment every H hours (default 24)")
    p.add_argument("--record-max-mb", type=float, default=1024, metavar="MB",
                   help="with --record DIR/: delete the oldest segments beyond MB megabytes (default 1024; a segment "
                   "is also closed at an eighth of it)")
    p.add_argument("--record-hash-key", metavar="KEY",
                   help="hash namespaces and names in the trace with this key")
    p.add_argument("--text-logs", action="store_true", help="human-readable logs instead of JSON lines")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("release-brakes", help="end the brakes' hold on stops (an admin's confirmation: "
                       "ConfigMap kf-culler-brakes in the culler's namespace)",
                       epilog=_epilog("release-brakes"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig to use (default: in-cluster service account, else ~/.kube/config)")
    _namespace_arg(p)
    p.set_defaults(func=cmd_release_brakes)

    p = sub.add_parser("demo", help="a local control plane, real Jupyter servers, and a culling to watch",
                       epilog=_epilog("demo"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idle-seconds", type=float, default=30.0, help="the demo's idle limit (default 30)")
    p.add_argument("--warn-seconds", type=float, default=15.0, help="warning before the stop (default 15)")
    p.add_argument("--gpu", action="store_true",
                   help="the GPU story: a full local cluster with Kubeflow's notebook-controller, where "
                   "stopping an idle notebook hands its GPU to one waiting")
    p.add_argument("--target", choices=("notebooks", "workspaces"), default="notebooks",
                   help="workspaces: a full local cluster with Kubeflow Notebooks 2.0's Workspace controller, "
                   "where an idle Workspace is paused with its reason (docs/targets.md)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("fleet", help="write a seeded synthetic fleet trace (with ground truth) for replay",
                       epilog=_epilog("fleet"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--notebooks", type=int, default=500, help="number of notebooks (default 500)")
    p.add_argument("--days", type=float, default=7, help="days to cover, from a Monday 00:00 UTC (default 7)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--out", "-o", metavar="FILE", default="fleet.jsonl.gz",
                   help="trace to write; .gz compresses (default fleet.jsonl.gz)")
    p.add_argument("--check-minutes", type=int, default=5, help="minutes between records (default 5)")
    p.add_argument("--start", metavar="RFC3339", help="trace start (default 2026-03-02T00:00:00Z, a Monday)")
    p.add_argument("--mix", metavar="NAME=WEIGHT,...", help="behaviour weights (default: the built-in mix)")
    p.add_argument("--gpu-lookback", type=int, default=30,
                   help="minutes of GPU samples per record (default 30)")
    p.add_argument("--gpu-step", type=int, default=5, help="minutes between GPU samples (default 5)")
    p.add_argument("--list-behaviours", action="store_true", help="list the behaviours and their weights")
    p.set_defaults(func=cmd_fleet)

    p = sub.add_parser("replay", help="replay a trace through policies: GPU-hours reclaimed, interruptions",
                       epilog=_epilog("replay"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="trace file (JSON Lines, .gz allowed), or a directory "
                   "recorded with run --record DIR/ (docs/replay.md)")
    p.add_argument("--config", "-c", metavar="POLICY", help="policy YAML/JSON (default: built-in defaults)")
    p.add_argument("--compare", action="append", metavar="POLICY",
                   help="another policy file, or kubeflow-kernel[:MINUTES], gpu-only[:MINUTES[:UTIL]], "
                   "defaults; repeatable")
    p.add_argument("--plot", metavar="PNG", help="write the comparison plot here")
    p.add_argument("--timeline", metavar="NAMESPACE/NAME", help="print one notebook's timeline (and plot it "
                   "next to --plot as *-timeline.png)")
    p.add_argument("--timeline-plot", metavar="PNG", help="where to write the --timeline plot")
    p.add_argument("--restart-delay", type=float, default=5, metavar="MINUTES",
                   help="minutes from a user's return to a restarted pod (default 5)")
    p.add_argument("--check-period", type=float, metavar="MINUTES",
                   help="how often each notebook is decided (default: at every record of the trace)")
    p.add_argument("--oracle-idle", type=float, metavar="MINUTES",
                   help="the oracle's idle limit (default: idleMinutes of --config)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--max-list", type=int, default=20, help="interruptions listed per policy (default 20)")
    s = p.add_argument_group("policy sweep (docs/replay.md, \"Sweeping policies\")")
    s.add_argument("--sweep", action="store_true",
                   help="replay a grid of policies around --config (the current configuration): the frontier of "
                   "GPU-hours reclaimed against restarts and interruptions, and a recommended configuration")
    s.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                   help="values of one policy key to sweep (idleMinutes, warnMinutes, connectedGpuIdleMinutes, "
                   "busyKernelGpuIdleMinutes, noSignalGpuIdleMinutes; `off` for null); repeatable (default: "
                   "idleMinutes=15,30,60,120,240, connectedGpuIdleMinutes=off,120, "
                   "busyKernelGpuIdleMinutes=off,60,240)")
    s.add_argument("--per", choices=("namespace", "rule"),
                   help="also find each namespace's (or policy rule's) best policy, and recommend per-group "
                   "settings where that reclaims more")
    s.add_argument("--max-restarts-per-session-day", type=float, default=1.0, metavar="N",
                   help="the budget of the recommendation (default 1); it must also interrupt nothing")
    s.add_argument("--jobs", type=int, default=1, metavar="N", help="replay the grid in N processes (default 1)")
    s.add_argument("--write-config", metavar="FILE",
                   help="write the recommended configuration here (the current one with the recommendation's keys)")
    s.add_argument("--bound-gpu-hours", type=float, metavar="H",
                   help="draw a reference line at H GPU-hours reclaimed on the --plot (e.g. a published bound)")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("convert", help="convert a NotebookOS workload template (JSON) into a replay trace",
                       epilog=_epilog("convert"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("template", metavar="TEMPLATE", help="the workload template (docs/replay.md)")
    p.add_argument("--out", "-o", metavar="FILE", required=True, help="trace to write; .gz compresses")
    p.add_argument("--namespace", default="notebookos", help="namespace of the sessions' notebooks (default "
                   "notebookos)")
    p.add_argument("--start", metavar="RFC3339", help="time of tick 0 (default 2021-06-01T00:00:00Z)")
    p.add_argument("--check-minutes", type=int, default=1, help="minutes between records (default 1, one tick)")
    p.add_argument("--until-hours", type=float, metavar="H", help="only the first H hours of the template")
    p.set_defaults(func=cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
