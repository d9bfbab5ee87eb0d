"""docs/install.md's inventory and RBAC tables against what the kustomize tree renders (with the real
kubectl/kustomize, tests/support/kustomize.py).

- Inventory ("What gets installed"): every folder under kustomize/ holding a kustomization is a row, every row
  names a path that exists, and each component's row names every Role and ClusterRole the component renders.
- RBAC ("RBAC: the rights the culler has, and why"): the three tables of the base (ClusterRole `kf-culler`, Roles
  `kf-culler-leader-election` and `kf-culler-records`) and the components' table hold exactly the rules the
  overlays and the components render: the same role, API group, resource, names and verbs, nothing missing,
  nothing extra.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kustomize import render

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "kustomize"
INSTALL = ROOT / "docs" / "install.md"
BASE_ROLES = ("kf-culler", "kf-culler-leader-election", "kf-culler-records")

# (role, API group, resource, resource names as patterns or None, verbs)
Rule = tuple[str, str, str, frozenset[str] | None, frozenset[str]]


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n#", start + 1)  # to the next heading of any level
    return text[start:end if end >= 0 else len(text)]


def _tables(section: str) -> list[tuple[str, list[list[str]]]]:
    """Each table of a section, with the paragraph line just before it and its rows' cells (header dropped)."""
    out: list[tuple[str, list[list[str]]]] = []
    lines = section.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            para = []
            while j >= 0 and lines[j].strip():
                para.insert(0, lines[j])
                j -= 1
            lead = " ".join(para)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip()[1:-1].split("|")])
                i += 1
            out.append((lead, rows))
        else:
            i += 1
    return out


def _names_pattern(name: str) -> str:
    """A resource name as the docs write a numbered family: trailing digits (or `<i>`) as `<n>`."""
    return re.sub(r"(\d+|<[a-z]+>)$", "<n>", name)


def _doc_rule(role: str, group: str, resource: str, verbs: str) -> list[Rule]:
    group = "" if group == "core" else group.strip("`")
    names_part = resource.split(" named ", 1)[1] if " named " in resource else None
    resources = re.findall(r"`([^`]+)`", resource.split(" named ", 1)[0])
    names = None
    if names_part is not None:
        names = frozenset(_names_pattern(n) for n in re.findall(r"`([^`]+)`", names_part) if not n.startswith("-"))
    verb_set = frozenset(v.strip() for v in verbs.split(","))
    return [(role, group, r, names, verb_set) for r in resources]


def documented_rules() -> dict[str, set[Rule]]:
    """The RBAC section's rules: the base's under "base", each component's under its name."""
    section = _section(INSTALL.read_text(), "## RBAC: the rights the culler has, and why")
    out: dict[str, set[Rule]] = {"base": set()}
    for lead, rows in _tables(section):
        if rows and len(rows[0]) == 6:  # component | object | API group | resource | verbs | why
            role = ""
            for component, obj, group, resource, verbs, _why in rows:
                if obj:
                    found = re.findall(r"`(kf-culler[^`]*)`", obj)
                    assert found, f"the row of {component} names no role: {obj!r}"
                    role = found[0]
                assert role, f"the first row of {component} names no role"
                out.setdefault(component.strip("`"), set()).update(_doc_rule(role, group, resource, verbs))
        else:
            roles = re.findall(r"(?:ClusterRole|Role) `(kf-culler[^`]*)`", lead)
            assert len(roles) == 1, f"a table of the base's rights after {lead!r} names no single role"
            for group, resource, verbs, _why in rows:
                out["base"].update(_doc_rule(roles[0], group, resource, verbs))
    return out


def _rendered_rules(objs: list[dict[str, Any]], skip: tuple[str, ...] = ()) -> set[Rule]:
    out: set[Rule] = set()
    for o in objs:
        if o["kind"] not in ("Role", "ClusterRole") or o["metadata"]["name"] in skip:
            continue
        for rule in o.get("rules", []):
            names = rule.get("resourceNames")
            for group in rule.get("apiGroups", []):
                for resource in rule["resources"]:
                    out.add((o["metadata"]["name"], group, resource,
                             frozenset(_names_pattern(n) for n in names) if names else None,
                             frozenset(rule["verbs"])))
    return out


def _with_component(component: str, tmp: Path) -> list[dict[str, Any]]:
    rel = os.path.relpath(KUSTOMIZE, tmp)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{rel}/base"], "components": [f"{rel}/components/{component}"]}))
    return render(tmp)


COMPONENTS = sorted(p.name for p in (KUSTOMIZE / "components").iterdir() if (p / "kustomization.yaml").exists())


def _merged(rules: set[Rule]) -> set[Rule]:
    """The verbs of one role on one resource (and names) together: the docs may give them on two rows."""
    verbs: dict[tuple[str, str, str, frozenset[str] | None], frozenset[str]] = {}
    for role, group, resource, names, vs in rules:
        key = (role, group, resource, names)
        verbs[key] = verbs.get(key, frozenset()) | vs
    return {(*key, vs) for key, vs in verbs.items()}


def _fmt(rules: set[Rule]) -> list[str]:
    return sorted(f"{r[0]}: {r[1] or 'core'}/{r[2]} names={sorted(r[3]) if r[3] else '*'} verbs={sorted(r[4])}"
                  for r in rules)


@pytest.mark.parametrize("overlay", ["kubeflow", "gpu-only", "openshift-ai"])
def test_the_base_rbac_tables_are_what_the_overlays_render(overlay: str) -> None:
    """The base's three tables hold every rule the overlay's roles render, and nothing else."""
    rendered = _merged(_rendered_rules(render(KUSTOMIZE / "overlays" / overlay)))
    documented = _merged(documented_rules()["base"])
    assert {r[0] for r in rendered} == set(BASE_ROLES)
    assert _fmt(rendered - documented) == [], "rendered, not in docs/install.md's RBAC tables"
    assert _fmt(documented - rendered) == [], "in docs/install.md's RBAC tables, not rendered"


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_components_rbac_table_is_what_each_component_renders(component: str, tmp_path: Path) -> None:
    """The components' table holds, for each component, exactly the rules of the roles it adds to the base."""
    rendered = _merged(_rendered_rules(_with_component(component, tmp_path), skip=BASE_ROLES))
    documented = _merged(documented_rules().get(component, set()))
    assert _fmt(rendered - documented) == [], f"{component}: rendered, not in docs/install.md's components table"
    assert _fmt(documented - rendered) == [], f"{component}: in docs/install.md's components table, not rendered"


def test_every_documented_component_exists() -> None:
    assert set(documented_rules()) - {"base"} <= set(COMPONENTS)


def _inventory() -> dict[str, str]:
    section = _section(INSTALL.read_text(), "## What gets installed")
    ((_lead, rows),) = _tables(section)
    return {re.fullmatch(r"`([^`]+)`", row[0]).group(1).rstrip("/"): row[1] for row in rows}  # type: ignore[union-attr]


def test_the_inventory_names_every_kustomization_and_only_what_exists() -> None:
    inventory = _inventory()
    folders = {str(p.parent.relative_to(KUSTOMIZE)) for p in KUSTOMIZE.rglob("kustomization.yaml")}
    assert sorted(folders - set(inventory)) == [], "kustomize/ folders missing from docs/install.md's inventory"
    assert sorted(p for p in inventory if not (KUSTOMIZE / p).exists()) == [], "inventory rows naming nothing"


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_components_inventory_row_names_its_roles(component: str, tmp_path: Path) -> None:
    row = _inventory()[f"components/{component}"]
    roles = {o["metadata"]["name"] for o in _with_component(component, tmp_path)
             if o["kind"] in ("Role", "ClusterRole")} - set(BASE_ROLES)
    assert sorted(r for r in roles if f"`{r}`" not in row) == [], f"components/{component}'s row: {row}"
