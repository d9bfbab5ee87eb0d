"""The admin's config.yaml with the fragments beside it (kf_culler/config_layers.py): fragments add, the admin's keys
win, two fragments disagreeing is an error naming both, and every bad key names the file that set it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kf_culler.config import ConfigError, load_file
from kf_culler.config_layers import fragment_paths, load_layered


def write(directory: Path, files: dict[str, object]) -> Path:
    for name, data in files.items():
        (directory / name).write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return directory / "config.yaml"


def test_fragments_add_targets_and_sections_and_the_admins_keys_win(tmp_path: Path) -> None:
    config = write(tmp_path, {
        "config.yaml": {"dryRun": True, "gpuOnly": True, "istio": {"principal": "example.org/ns/tools/sa/culler"}},
        "coder.fragment.yaml": {"targets": ["coder"], "coder": {
            "url": "http://coder.coder.svc", "tokenFile": "/t", "namespace": "coder"}},
        "istio-policies.fragment.yaml": {"istio": {
            "manageAuthorizationPolicies": True, "principal": "cluster.local/ns/kubeflow/sa/kf-culler"}},
        "workspaces.fragment.yaml": {"targets": ["workspaces"], "dryRun": False},
        "notes.yaml": {"bogus": 1},  # not a fragment: never read
    })
    ops = load_layered(config).operations
    assert (ops.dry_run, ops.gpu_only) == (True, True)
    assert ops.targets == ("notebooks", "coder", "workspaces")
    assert ops.coder is not None and ops.coder.url == "http://coder.coder.svc"
    assert ops.istio.manage_authorization_policies is True
    assert ops.istio.principal == "example.org/ns/tools/sa/culler"  # the admin's, key by key
    assert [p.name for p in fragment_paths(config)] == [
        "coder.fragment.yaml", "istio-policies.fragment.yaml", "workspaces.fragment.yaml"]


def test_the_admins_targets_come_first_and_a_fragment_only_adds(tmp_path: Path) -> None:
    config = write(tmp_path, {"config.yaml": {"targets": ["workspaces"]},
                              "workspaces.fragment.yaml": {"targets": ["workspaces"]}})
    assert load_layered(config).operations.targets == ("workspaces",)


def test_two_fragments_setting_one_key_differently_is_an_error_naming_both(tmp_path: Path) -> None:
    config = write(tmp_path, {"config.yaml": {},
                              "a.fragment.yaml": {"istio": {"reconcileEveryPasses": 1}},
                              "b.fragment.yaml": {"istio": {"reconcileEveryPasses": 2}}})
    with pytest.raises(ConfigError) as err:
        load_layered(config)
    message = str(err.value)
    assert "b.fragment.yaml: key 'istio.reconcileEveryPasses'" in message and "a.fragment.yaml" in message
    # The admin's file settles it: it wins over both.
    (tmp_path / "config.yaml").write_text("istio:\n  reconcileEveryPasses: 3\n")
    assert load_layered(config).operations.istio.reconcile_every_passes == 3


@pytest.mark.parametrize(("files", "needle"), [
    ({"w.fragment.yaml": {"targets": ["workspacez"]}}, "w.fragment.yaml: key 'targets.1'"),
    ({"w.fragment.yaml": {"idleMinutez": 3}}, "w.fragment.yaml: unknown key 'idleMinutez'"),
    ({"c.fragment.yaml": {"coder": {"url": "http://x", "tokenFile": "/t", "namespace": "c", "pageSize": "x"}}},
     "c.fragment.yaml: key 'coder.pageSize'"),
    ({"w.fragment.yaml": "- not a mapping\n"}, "w.fragment.yaml: the configuration must be a mapping"),
    ({"w.fragment.yaml": "a: [\n"}, "w.fragment.yaml: not valid YAML"),
])
def test_a_bad_key_names_the_file_that_set_it(tmp_path: Path, files: dict[str, object], needle: str) -> None:
    config = write(tmp_path, {"config.yaml": {"idleMinutes": 30}, **files})
    with pytest.raises(ConfigError) as err:
        load_layered(config)
    assert needle in str(err.value), str(err.value)
    assert str(tmp_path / "config.yaml") not in str(err.value).split(":")[0]


def test_a_bad_key_of_the_admin_names_the_admins_file(tmp_path: Path) -> None:
    config = write(tmp_path, {"config.yaml": {"idleMinutes": "sixty"}, "w.fragment.yaml": {"targets": ["workspaces"]}})
    with pytest.raises(ConfigError, match=r"config\.yaml: key 'idleMinutes'"):
        load_layered(config)


def test_without_fragments_it_is_the_file_alone(tmp_path: Path) -> None:
    config = write(tmp_path, {"config.yaml": {"idleMinutes": "sixty"}})
    with pytest.raises(ConfigError) as layered:
        load_layered(config)
    with pytest.raises(ConfigError) as alone:
        load_file(config)
    assert str(layered.value) == str(alone.value)
