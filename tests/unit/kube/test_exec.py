"""Exec credential plugins: run with args and env, ExecCredential parsed, cached until expiry,
run again after a 401 (invalidate), failures as one line. The plugin is a real script
(plugin.py) that counts its runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from elastra.errors import UserError
from elastra.kube.config import load_connection
from tests.unit.kube.helpers import kubeconfig, plugin

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def exec_config(tmp_path: Path, exec_entry: dict[str, Any]) -> Path:
    return kubeconfig(
        tmp_path / "config",
        clusters={"eks": "https://eks.example:443"},
        users={"u": {"exec": exec_entry}},
        contexts={"eks": {"cluster": "eks", "user": "u"}},
        current="eks",
    )


def entry(tmp_path: Path, *, version: str = "v1", **env: str) -> dict[str, Any]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    variables = {"PLUGIN_STATE": str(state), **env}
    return {
        "apiVersion": f"client.authentication.k8s.io/{version}",
        "command": str(plugin(tmp_path)),
        "args": ["get-token", "--cluster", "eks"],
        "env": [{"name": k, "value": v} for k, v in variables.items()],
        "provideClusterInfo": True,
    }


def calls(tmp_path: Path) -> int:
    return int((tmp_path / "state" / "calls").read_text())


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_plugin_token_is_cached_until_it_expires(tmp_path: Path, version: str) -> None:
    expires = (NOW + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    clock = Clock()
    path = exec_config(tmp_path, entry(tmp_path, version=version, PLUGIN_EXPIRES=expires))
    credentials = load_connection(str(path), clock=clock).credentials
    first = credentials.identity()
    assert first.token == "token-1"
    assert first.expires == NOW + timedelta(hours=1)
    clock.now = NOW + timedelta(minutes=59)
    assert credentials.identity().token == "token-1"
    assert calls(tmp_path) == 1
    clock.now = NOW + timedelta(hours=1)
    assert credentials.identity().token == "token-2"  # expired: the plugin ran again
    assert calls(tmp_path) == 2


def test_plugin_runs_again_after_the_server_refused_its_token(tmp_path: Path) -> None:
    credentials = load_connection(str(exec_config(tmp_path, entry(tmp_path)))).credentials
    assert credentials.identity().token == "token-1"
    assert credentials.identity().token == "token-1"  # no expiry: cached until refused
    credentials.invalidate()
    assert credentials.identity().token == "token-2"
    assert calls(tmp_path) == 2


def test_plugin_gets_exec_info_env_and_cluster(tmp_path: Path) -> None:
    path = exec_config(tmp_path, entry(tmp_path, version="v1beta1", PLUGIN_TOKEN="t-{n}"))
    assert load_connection(str(path)).credentials.identity().token == "t-1"
    info = json.loads((tmp_path / "state" / "exec-info.json").read_text())
    assert info["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "https://eks.example:443"


def test_relative_plugin_path_is_the_kubeconfigs(tmp_path: Path) -> None:
    exec_entry = entry(tmp_path)
    exec_entry["command"] = "./fake-plugin"
    path = exec_config(tmp_path, exec_entry)
    assert load_connection(str(path)).credentials.identity().token == "token-1"


def test_missing_plugin_says_how_to_install_it(tmp_path: Path) -> None:
    exec_entry = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "no-such-auth-plugin",
        "installHint": "install it with: brew install no-such-auth-plugin",
    }
    credentials = load_connection(str(exec_config(tmp_path, exec_entry))).credentials
    with pytest.raises(UserError, match=r"'no-such-auth-plugin' not found.*brew install"):
        credentials.identity()


def test_failing_plugin_is_one_line_with_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "broken"
    script.write_text("#!/bin/sh\necho 'please run: gcloud auth login' >&2\nexit 1\n")
    script.chmod(0o755)
    exec_entry = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script)}
    credentials = load_connection(str(exec_config(tmp_path, exec_entry))).credentials
    with pytest.raises(UserError, match="exited 1: please run: gcloud auth login"):
        credentials.identity()


def test_old_exec_api_version_is_refused(tmp_path: Path) -> None:
    path = exec_config(tmp_path, entry(tmp_path, version="v1alpha1"))
    with pytest.raises(UserError, match=r"exec apiVersion .*v1alpha1.* is not supported"):
        load_connection(str(path))


def test_plugin_client_certificate(tmp_path: Path) -> None:
    script = tmp_path / "cert-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": "CERT PEM", "clientKeyData": "KEY PEM"},
    }
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(credential)}\nEOF\n")
    script.chmod(0o755)
    exec_entry = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script)}
    identity = load_connection(str(exec_config(tmp_path, exec_entry))).credentials.identity()
    assert (identity.token, identity.cert_pem, identity.key_pem) == (None, b"CERT PEM", b"KEY PEM")


def test_plugin_that_needs_a_terminal_is_refused(tmp_path: Path) -> None:
    exec_entry = {**entry(tmp_path), "interactiveMode": "Always"}
    with pytest.raises(UserError, match=r"needs a terminal \(interactiveMode: Always\)"):
        load_connection(str(exec_config(tmp_path, exec_entry)))
