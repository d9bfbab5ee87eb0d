"""The culler's RBAC is exactly what its code uses: every Kubernetes API call in kf_culler, inventoried from the
source, against the rules the rendered base and each component grant the `kf-culler` ServiceAccount. A verb the code
uses that nothing grants fails; a verb a rule grants that no code uses fails.

The inventory is static (the source's calls, not a run with an audit log): every reference to a method of the
`kubernetes` client's API classes in kf_culler (all of it but kf_culler/local and the demos, which the image does
not ship), mapped to (API group, resource, verb) by the HTTP method and path the client itself sends for that
method; every reference to a request of kf_culler/kube/core.py (the requests sent without those classes), mapped by
the HTTP method and path its function sends (for its requests of an object of any kind, `read_object`,
`patch_object`, `read_cluster_object`, with the group and plural given where it is called); and every collection the
cache lists and watches by its path (`_lister`). A static inventory sees every code path, also the ones a test run
would not reach (the email notices, Istio policies, the prober identities, the workloads' /scale...), where an audit
log sees only what was run. Its over-approximations, each said where it is made:
  - the object calls whose group and plural are not constants (kf_culler/kube/writer.py's patch and
    re-read, whatever session kind it stops) count for every session kind the culler reads from the API
    server (kf_culler/targets/: Notebooks, Workspaces, Deployments, StatefulSets);
  - a list function handed to the cache (kf_culler/kube/cache.py) is listed, then watched, and so is every
    collection a target asks the cache for (`Target.watches`, with every workload kind and a Coder namespace).
Resource names (`resourceNames`) and namespaces are not compared: a rule with either still grants its verb.
"""

from __future__ import annotations

import ast
import inspect
import re
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from support.kustomize import render

from kf_culler import targets as targets_module
from kf_culler.targets import ALL, Scope, Target

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kf_culler"
SHIPPED = [p for p in sorted(PACKAGE.rglob("*.py"))
           if "local" not in p.relative_to(PACKAGE).parts and not p.name.startswith("demo")]
COMPONENTS = sorted(p.name for p in (ROOT / "kustomize" / "components").iterdir() if p.is_dir())
SERVICE_ACCOUNT = "kf-culler"
# What every authenticated user may do (the API server's default ClusterRole system:basic-user): no rule needed.
EVERYONE = {("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
            ("authorization.k8s.io", "selfsubjectrulesreviews", "create")}
# Reads only the admin's commands make, with the admin's kubeconfig: `kf-culler explain` reads a notebook's
# failed-notice Events (kf_culler/kube/events.py `newest_message`). The culler's ServiceAccount is not given the
# Events of every namespace for it; run as that account, explain says it could not read them.
ADMIN_ONLY = {("", "events", "list")}
# The session kinds the culler reads from the API server and writes to (Coder's workspaces are Coder's API's).
SESSION_TARGETS: tuple[Target, ...] = tuple(
    t for t in vars(targets_module).values() if isinstance(t, Target) and t.kind != "CoderWorkspace")

Triple = tuple[str, str, str]  # (API group, resource[/subresource], verb)


# --- the code's calls -------------------------------------------------------------------------------------

@cache
def _api_classes() -> dict[str, list[str]]:
    """Method name -> the names of the `kubernetes` client's API classes that have it."""
    out: dict[str, list[str]] = {}
    for cls_name in dir(kubernetes.client):  # a lazy module: its names, not its __dict__
        cls = getattr(kubernetes.client, cls_name)
        if not (cls_name.endswith("Api") and inspect.isclass(cls)) or cls_name == "ApiClient":
            continue
        for name in vars(cls):
            if not name.startswith("_") and f"_{name}_serialize" in vars(cls):  # the API's requests only
                out.setdefault(name, []).append(cls_name)
    return out


def _request(cls_name: str, method: str) -> tuple[str, str]:
    """(HTTP method, path template) the client sends for `cls_name.method`."""
    src = inspect.getsource(getattr(getattr(kubernetes.client, cls_name), f"_{method}_serialize"))
    found = re.search(r"method='([A-Z]+)',\s*resource_path='([^']+)'", src)
    assert found, f"{cls_name}.{method}: no request found in the client's source"
    return found.group(1), found.group(2)


def _triple(http: str, path: str, group: str | None = None, plural: str | None = None) -> Triple:
    """The (group, resource, verb) RBAC checks for a request (without ?watch)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        api_group, rest = "", parts[2:]
    else:
        api_group, rest = parts[1], parts[3:]
    if api_group == "{group}":
        assert group is not None, path
        api_group = group
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = plural if rest[0] == "{plural}" else rest[0]
    assert resource is not None, path
    named = len(rest) > 1
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http]
    return api_group, resource, verb


def _resolve(expr: ast.expr, module: Any, local: dict[str, ast.expr]) -> Any:
    """A constant, a module global or an attribute of one (through one local `x = GLOBAL`), else None."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        if expr.id in local:
            return _resolve(local[expr.id], module, {})
        return getattr(module, expr.id, None)
    if isinstance(expr, ast.Attribute):
        owner = _resolve(expr.value, module, local)
        return None if owner is None else getattr(owner, expr.attr, None)
    return None


def _custom_kinds(call_args: list[ast.expr], method: str, module: Any,
                  local: dict[str, ast.expr]) -> set[tuple[str, str]]:
    """(group, plural) pairs of a CustomObjectsApi call from its arguments (group, version, [namespace,] plural)."""
    plural_at = 3 if "namespaced" in method else 2
    if len(call_args) <= plural_at:
        return {(t.group, t.plural) for t in SESSION_TARGETS}
    group, plural = _resolve(call_args[0], module, local), _resolve(call_args[plural_at], module, local)
    if isinstance(group, str) and isinstance(plural, str):
        return {(group, plural)}
    # Not constants: the session kind the call is given (kf_culler/kube/writer.py), any of them.
    return {(t.group, t.plural) for t in SESSION_TARGETS}


CORE = PACKAGE / "kube" / "core.py"


def _segments(expr: ast.expr) -> str | None:
    """A path template from core.py's `_path(...)`: its constant segments kept, any other `{x}`; from its
    `_object_path(group, version, namespace, plural, name)`, an object of any kind, as the client's custom-object
    paths spell it (`{group}` and `{plural}` read where it is called), cluster-scoped when `namespace` is None."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "_path":
        return "/" + "/".join(a.value if isinstance(a, ast.Constant) else "{x}" for a in expr.args)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "_object_path":
        namespace = expr.args[2]
        cluster = isinstance(namespace, ast.Constant) and namespace.value is None
        return "/apis/{group}/{version}" + ("" if cluster else "/namespaces/{x}") + "/{plural}/{x}"
    return None


def _fstring(expr: ast.expr) -> str | None:
    """A path template from a string or an f-string: what is not constant becomes `{x}`."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in expr.values)
    return None


@cache
def core_requests() -> dict[str, tuple[str, str]]:
    """Each request function of kf_culler/kube/core.py -> the (HTTP method, path template) it sends."""
    out: dict[str, tuple[str, str]] = {}
    for fn in ast.parse(CORE.read_text()).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        sent = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id == "call"]
        if not sent:
            continue
        assert len(sent) == 1, f"core.{fn.name}: one request each"
        method, path = sent[0].args[1], _segments(sent[0].args[2])
        assert isinstance(method, ast.Constant) and path is not None, f"core.{fn.name}: its request is not constant"
        out[fn.name] = (str(method.value), path)
    return out


def _module(path: Path) -> Any:
    import importlib

    return importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))


def _functions(tree: ast.AST) -> Iterator[tuple[ast.AST, dict[str, ast.expr]]]:
    """Each function with its simple local assignments `name = expr` (and the module, with none)."""
    yield tree, {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = {n.targets[0].id: n.value for n in ast.walk(node)
                     if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
            yield node, local


@cache
def code_uses() -> dict[Triple, set[str]]:
    """Every (group, resource, verb) the shipped code's API calls need, with where each is called."""
    methods = _api_classes()
    named = {p: set(re.findall(r"\b(\w+Api)\b", p.read_text())) for p in SHIPPED}
    everywhere = set().union(*named.values())
    out: dict[Triple, set[str]] = {}
    for path in SHIPPED:
        tree = ast.parse(path.read_text())
        module = None
        seen: set[int] = set()
        # Innermost function first, so that a reference is read with its own function's locals.
        scopes = sorted(_functions(tree), key=lambda s: -getattr(s[0], "lineno", 0))
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        # A method handed to another callable (functools.partial, _bind, with_backoff): its arguments follow it.
        handed = {id(a): (n, i) for n in ast.walk(tree) if isinstance(n, ast.Call) for i, a in enumerate(n.args)}
        for scope, local in scopes:
            for node in ast.walk(scope):
                if not isinstance(node, ast.Attribute) or node.attr not in methods or id(node) in seen:
                    continue
                seen.add(id(node))
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                classes = [c for c in methods[node.attr] if c in named[path]] or \
                          [c for c in methods[node.attr] if c in everywhere]
                assert len(classes) == 1, f"{where}: {node.attr} of which API class? {methods[node.attr]}"
                http, template = _request(classes[0], node.attr)
                if id(node) in calls:
                    args = calls[id(node)].args
                elif id(node) in handed:
                    outer, i = handed[id(node)]
                    args = outer.args[i + 1:]
                else:
                    args = []
                if "{group}" in template:
                    module = module or _module(path)
                    found = {_triple(http, template, g, p) for g, p in _custom_kinds(args, node.attr, module, local)}
                else:
                    found = {_triple(http, template)}
                if path.name == "cache.py" and path.parent.name == "kube":  # kf_culler/kube/cache.py watches
                    found |= {(g, r, "watch") for g, r, v in found if v == "list"}
                for t in found:
                    out.setdefault(t, set()).add(where)
        # kf_culler/kube/core.py's requests, wherever the shipped code names one (`core.read_config_map`, ...).
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "core" \
                    and node.attr in core_requests():
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                http, template = core_requests()[node.attr]
                if "{group}" in template:  # an object of any kind: its group and plural where it is called
                    if id(node) in calls:
                        args = calls[id(node)].args[1:]  # after the ApiClient
                    elif id(node) in handed:
                        outer, i = handed[id(node)]
                        args = outer.args[i + 2:]
                    else:
                        args = []
                    module = module or _module(path)
                    local = next((loc for scope, loc in scopes if scope is not tree and any(
                        n is node for n in ast.walk(scope))), {})
                    kind = "namespaced" if "/namespaces/" in template else "cluster"
                    for g, p in _custom_kinds(args, kind, module, local):
                        out.setdefault(_triple(http, template, g, p), set()).add(where)
                else:
                    out.setdefault(_triple(http, template), set()).add(where)
            # A collection the cache lists and watches by its path (the culler's records, the Nodes).
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_lister" \
                    and len(node.args) > 1 and (template := _fstring(node.args[1])) is not None:
                for verb in ("list", "watch"):
                    g, r, _ = _triple("GET", template)
                    out.setdefault((g, r, verb), set()).add(f"{path.relative_to(ROOT)}:{node.lineno}")
    # The collections the targets ask the cache for: it lists and watches each (kf_culler/kube/cache.py `_lister`).
    scope = Scope(workload_kinds=("Deployment", "StatefulSet"), coder_namespace="coder")
    for target in ALL:
        for w in target.watches(scope):
            for verb in ("list", "watch"):
                out.setdefault((w.group, w.plural, verb), set()).add(f"kf_culler/kube/cache.py:{target.name}")
    return out


# --- the rendered rules -----------------------------------------------------------------------------------

def granted(objs: list[dict[str, Any]]) -> set[Triple]:
    """(group, resource, verb) of every rule of a Role or ClusterRole bound to the culler's ServiceAccount."""
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objs
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s.get("kind") == "ServiceAccount" and s.get("name") == SERVICE_ACCOUNT
                     for s in b.get("subjects") or [])}
    out: set[Triple] = set()
    for role in objs:
        if role["kind"] in ("Role", "ClusterRole") and (role["kind"], role["metadata"]["name"]) in bound:
            for rule in role.get("rules") or []:
                out |= {(g, r, v) for g in rule.get("apiGroups", []) for r in rule.get("resources", [])
                        for v in rule.get("verbs", [])}
    return out


@cache
def parts() -> dict[str, set[Triple]]:
    """What the base grants, and what each component adds to it."""
    base = granted(render(ROOT / "kustomize" / "base"))
    out = {"base": base}
    for name in COMPONENTS:
        with tempfile.TemporaryDirectory(dir=ROOT / "kustomize") as tmp:
            Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": ["../base"], "components": [f"../components/{name}"]}))
            out[name] = granted(render(tmp)) - base
    return out


def _show(triples: set[Triple]) -> str:
    return ", ".join(f"{v} {g or 'core'}/{r}" for g, r, v in sorted(triples))


def test_the_inventory_finds_the_calls() -> None:
    """The inventory reads the code: the calls every pass makes are in it, where they are made."""
    uses = code_uses()
    assert set(uses) >= ADMIN_ONLY, "an admin-only read the code no longer makes: drop it from ADMIN_ONLY"
    for triple, module in [(("kubeflow.org", "notebooks", "watch"), "kube/cache.py"),
                           (("kubeflow.org", "notebooks", "patch"), "kube/writer.py"),
                           (("", "events", "create"), "kube/events.py"),
                           (("coordination.k8s.io", "leases", "update"), "kube/lease.py"),
                           (("", "configmaps", "patch"), "kube/records.py")]:
        assert any(w.startswith(f"kf_culler/{module}:") for w in uses.get(triple, ())), (triple, uses.get(triple))


def test_every_call_the_code_makes_is_granted() -> None:
    """A verb the code uses that neither the base nor any component grants: the culler would be refused."""
    grants = set().union(*parts().values())
    missing = {t: w for t, w in code_uses().items() if t not in grants and t not in EVERYONE | ADMIN_ONLY}
    assert not missing, "used by the code, granted by no rule: " + "; ".join(
        f"{_show({t})} ({', '.join(sorted(w))})" for t, w in sorted(missing.items()))


@pytest.mark.parametrize("part", ["base", *COMPONENTS])
def test_every_verb_granted_is_used(part: str) -> None:
    """A verb the base or a component grants the culler that no code uses: a right it must not hold."""
    unused = parts()[part] - set(code_uses())
    assert not unused, f"{part} grants what no code uses: {_show(unused)}"
