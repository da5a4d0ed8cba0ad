"""Host tools are looked up only through ``e2e.hostpkgs.require``, which installs them first.

A fresh machine has none of the node's packages. `make demo` once stopped there with
"'iptables' missing" because a check ran a few lines before the install; the scan below fails
on any such direct lookup of a known host tool anywhere under ``e2e/``.
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
from e2e import hostpkgs

E2E = Path(__file__).resolve().parents[2] / "e2e"


def direct_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """``shutil.which("tool")`` or ``Path("/file").exists()`` of a packaged probe."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        arg = node.args[0]
        if not (isinstance(arg, ast.Constant) and arg.value in hostpkgs.PACKAGES):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("which", "Path"):
            found.append((node.lineno, str(arg.value)))
    return found


def test_no_host_tool_is_looked_up_before_its_package_is_installed() -> None:
    offenders = [
        f"{path.relative_to(E2E.parent)}:{line}: {tool}"
        for path in sorted(E2E.rglob("*.py"))
        if path.name != "hostpkgs.py"
        for line, tool in direct_lookups(ast.parse(path.read_text()))
    ]
    assert offenders == [], "use e2e.hostpkgs.require(tool), which installs it first"


def test_the_scan_sees_a_direct_lookup() -> None:
    bad = ast.parse('import shutil\nif shutil.which("iptables") is None: raise SystemExit')
    assert direct_lookups(bad) == [(2, "iptables")]


def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, installs: bool) -> Path:
    """A PATH with only an apt-get that logs its arguments and maybe 'installs' socat."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "apt.log"
    make_socat = (
        f'printf "#!/bin/sh\\n" > {bindir}/socat; /bin/chmod +x {bindir}/socat' if installs else ""
    )
    script = bindir / "apt-get"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{make_socat}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bindir))
    return log


def test_require_installs_the_missing_package_and_returns_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_apt(tmp_path, monkeypatch, installs=True)
    path = hostpkgs.require("socat")
    assert path == str(tmp_path / "bin" / "socat")
    assert log.read_text().split() == ["install", "-y", "-q", "--no-install-recommends", "socat"]
    assert os.access(path, os.X_OK)


def test_a_package_that_does_not_appear_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_apt(tmp_path, monkeypatch, installs=False)
    with pytest.raises(hostpkgs.HostPackageError, match="'socat' is still missing"):
        hostpkgs.require("socat")
