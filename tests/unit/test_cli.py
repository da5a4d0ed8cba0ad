"""The ``elastra`` command line: help, version, crds, and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
