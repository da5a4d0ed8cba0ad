"""The ``elastra`` command line: help, version, crds, and one-line errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import elastra
from elastra.api.crd import render_crds
from elastra.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"elastra {elastra.__version__}\n"


def test_crds_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds"]) == 0
    assert capsys.readouterr().out == render_crds()


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "version" in out and "crds" in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "elastra.cli", "version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("elastra ")


def unreachable_kubeconfig(tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig whose server is a local port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        server = f"https://127.0.0.1:{probe.getsockname()[1]}"
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "kind-x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "kind-x",
            }
        )
    )
    return path, server


@pytest.mark.parametrize("command", [["status", "some-job"], ["run", "--metrics-port=0"]])
def test_unreachable_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    path, server = unreachable_kubeconfig(tmp_path)
    assert main([*command, f"--kubeconfig={path}", "--context=kind-x"]) == 3
    captured = capsys.readouterr()
    assert captured.err == (
        f"elastra: error: cannot reach the API server at {server} (connection refused): "
        f"is the cluster up? (kubeconfig {path}, context kind-x)\n"
    )


def test_a_sharing_scope_it_does_not_know_is_a_usage_error_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--sharing=everywhere"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--sharing: invalid choice: 'everywhere'" in err
    assert "'off', 'namespace', 'cluster'" in err
