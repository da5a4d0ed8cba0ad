"""The one line a permanently failed worker leaves: on stderr, and as its termination message
where the kubelet made that file (never created elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastra_worker.exitcodes import CONFIG
from elastra_worker.termination import (
    MAX_MESSAGE,
    TERMINATION_LOG_ENV,
    exit_permanent,
    one_line,
    report_permanent,
)


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        ("plain", "plain"),
        ("  two\nlines\t and  tabs \n", "two lines and tabs"),
        ("x" * (MAX_MESSAGE + 50), "x" * (MAX_MESSAGE - 3) + "..."),
    ],
)
def test_a_reason_becomes_one_bounded_line(reason: str, line: str) -> None:
    assert one_line(reason) == line


def test_the_line_is_written_where_the_file_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "termination-log"
    message.write_text("an older message\n")
    env = {TERMINATION_LOG_ENV: str(message)}
    with pytest.raises(SystemExit) as caught:
        exit_permanent("the root is\na file", env)
    assert caught.value.code == CONFIG
    assert message.read_text() == "the root is a file\n"
    assert capsys.readouterr().err == "the root is a file\n"


def test_no_file_is_created_outside_a_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent"
    assert report_permanent("why", {TERMINATION_LOG_ENV: str(missing)}) == "why"
    assert not missing.exists()
    assert capsys.readouterr().err == "why\n"
