"""Kubeconfig loading as kubectl does it: merged files, contexts, token files, in-cluster,
auth-providers. (Exec plugins: test_exec.py.)"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from elastra.errors import UserError
from elastra.kube.config import load_connection
from tests.unit.kube.helpers import kubeconfig

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def two_files(tmp_path: Path) -> tuple[Path, Path]:
    first = kubeconfig(
        tmp_path / "first",
        clusters={"shared": "https://first:6443"},
        users={"alice": {"token": "alice-1"}},
        contexts={"a": {"cluster": "shared", "user": "alice", "namespace": "team-a"}},
    )  # no current-context: the second file's applies
    second = kubeconfig(
        tmp_path / "second",
        clusters={"shared": "https://second:6443", "other": "https://other:6443"},
        users={"alice": {"token": "alice-2"}, "bob": {"token": "bob"}},
        contexts={
            "a": {"cluster": "other", "user": "bob"},
            "b": {"cluster": "other", "user": "bob"},
        },
        current="a",
    )
    return first, second


def test_kubeconfig_list_merges_first_entry_wins(tmp_path: Path) -> None:
    first, second = two_files(tmp_path)
    missing = tmp_path / "missing"
    env = {"KUBECONFIG": os.pathsep.join(map(str, (first, missing, second)))}
    connection = load_connection(env=env, home=tmp_path)
    assert connection.server == "https://first:6443"  # context a and cluster shared: first file's
    assert connection.credentials.identity().token == "alice-1"
    assert connection.namespace == "team-a"
    assert connection.source == f"kubeconfig {first}:{second}, context a"


def test_current_context_comes_from_the_first_file_that_sets_it(tmp_path: Path) -> None:
    first, second = two_files(tmp_path)
    third = kubeconfig(tmp_path / "third", current="b")
    env = {"KUBECONFIG": os.pathsep.join(map(str, (first, second, third)))}
    assert load_connection(env=env, home=tmp_path).source.endswith("context a")


def test_context_flag_picks_another_context(tmp_path: Path) -> None:
    first, second = two_files(tmp_path)
    env = {"KUBECONFIG": f"{first}{os.pathsep}{second}"}
    connection = load_connection(context="b", env=env, home=tmp_path)
    assert (connection.server, connection.namespace) == ("https://other:6443", "default")
    assert connection.credentials.identity().token == "bob"


def test_unknown_context_names_the_known_ones(tmp_path: Path) -> None:
    first, _ = two_files(tmp_path)
    with pytest.raises(UserError, match=r"no context named 'nope' \(known: a\)"):
        load_connection(str(first), context="nope")


def test_kubeconfig_flag_reads_only_that_file(tmp_path: Path) -> None:
    first, second = two_files(tmp_path)
    env = {"KUBECONFIG": str(first)}
    assert load_connection(str(second), env=env).server == "https://other:6443"


def test_kubeconfig_list_of_missing_files_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="none of the KUBECONFIG files exist"):
        load_connection(env={"KUBECONFIG": str(tmp_path / "gone")}, home=tmp_path)


def test_home_kubeconfig_when_nothing_else(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    kubeconfig(
        tmp_path / ".kube" / "config",
        clusters={"c": "https://home:6443"},
        contexts={"c": {"cluster": "c"}},
        current="c",
    )
    connection = load_connection(env={}, home=tmp_path, service_account=tmp_path / "no-sa")
    assert connection.server == "https://home:6443"
    assert connection.credentials.identity().token is None  # a context without a user


def test_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    path = kubeconfig(
        tmp_path / "config",
        clusters={"c": "https://c:6443"},
        users={"u": {"tokenFile": "token"}},  # relative to the kubeconfig's directory
        contexts={"c": {"cluster": "c", "user": "u"}},
        current="c",
    )
    credentials = load_connection(str(path)).credentials
    assert credentials.identity().token == "one"
    token.write_text("two, rotated\n")
    assert credentials.identity().token == "two, rotated"


def fake_service_account(root: Path) -> Path:
    sa = root / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("sa-token-1")
    (sa / "ca.crt").write_bytes(b"not parsed until a request")
    (sa / "namespace").write_text("elastra-system")
    return sa


def test_in_cluster_service_account(tmp_path: Path) -> None:
    sa = fake_service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "8443"}
    connection = load_connection(env=env, service_account=sa, home=tmp_path)
    assert connection.server == "https://10.96.0.1:8443"
    assert connection.namespace == "elastra-system"
    assert connection.ca_pem == b"not parsed until a request"
    assert connection.credentials.identity().token == "sa-token-1"
    (sa / "token").write_text("sa-token-2 (kubelet rotated it)")
    assert connection.credentials.identity().token == "sa-token-2 (kubelet rotated it)"


def test_in_cluster_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    sa = fake_service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1"}
    assert load_connection(env=env, service_account=sa).server == "https://[fd00::1]:443"


def test_nothing_to_load_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="set KUBECONFIG or --kubeconfig"):
        load_connection(env={}, home=tmp_path, service_account=tmp_path / "none")


def provider_config(tmp_path: Path, provider: dict[str, object]) -> Path:
    return kubeconfig(
        tmp_path / "config",
        clusters={"gke": "https://gke:443"},
        users={"u": {"auth-provider": provider}},
        contexts={"gke": {"cluster": "gke", "user": "u"}},
        current="gke",
    )


def test_auth_provider_static_access_token(tmp_path: Path) -> None:
    path = provider_config(
        tmp_path,
        {"name": "gcp", "config": {"access-token": "ya29.x", "expiry": "2026-06-01T00:00:00Z"}},
    )
    assert load_connection(str(path), clock=lambda: NOW).credentials.identity().token == "ya29.x"


def test_auth_provider_expired_access_token_is_refused(tmp_path: Path) -> None:
    path = provider_config(
        tmp_path,
        {"name": "gcp", "config": {"access-token": "old", "expiry": "2025-01-01T00:00:00Z"}},
    )
    with pytest.raises(UserError, match=r"expired at 2025-01-01T00:00:00Z.*gke-gcloud-auth-plugin"):
        load_connection(str(path), clock=lambda: NOW)


@pytest.mark.parametrize(
    ("name", "replacement"),
    [("gcp", "gke-gcloud-auth-plugin"), ("azure", "kubelogin"), ("keystone", "exec")],
)
def test_unsupported_auth_provider_is_named(tmp_path: Path, name: str, replacement: str) -> None:
    path = provider_config(tmp_path, {"name": name, "config": {"cmd-path": "gcloud"}})
    with pytest.raises(UserError, match=f"auth-provider '{name}' is not supported") as err:
        load_connection(str(path))
    assert replacement in str(err.value)


def test_oidc_id_token_is_used(tmp_path: Path) -> None:
    path = provider_config(tmp_path, {"name": "oidc", "config": {"id-token": "eyJ.id"}})
    assert load_connection(str(path)).credentials.identity().token == "eyJ.id"
