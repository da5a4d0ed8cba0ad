"""The example GPT (or the module ``$AUDIT_MODULE``) recording each file it reads under a folder.

Why: "no read of the checkpoint volume" must be observed, not inferred from what the trainer
says of itself. A Python audit hook sees every ``open`` the process makes (builtin ``open``,
``os.open``, ``pathlib``'s readers, and so DCP's reader and the manifest reader) and appends the
path of each read-only open of a file (not a directory: a commit opens directories to fsync
them) under ``$AUDIT_ROOT`` to ``$AUDIT_LOG``, through a descriptor opened
before the hook (writing from inside the hook must not raise another event).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "worker_image" / "examples" / "train_tiny_gpt.py"


def _reads(root: str, fd: int) -> Any:
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
            return
        path = os.fsdecode(args[0])
        mode, flags = args[1], args[2]
        reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else (
            isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY
        )  # fmt: skip
        if reading and os.path.abspath(path).startswith(root) and not os.path.isdir(path):
            os.write(fd, f"{os.getpid()} {path}\n".encode())

    return hook


def main() -> None:
    root = os.path.abspath(os.environ["AUDIT_ROOT"])
    fd = os.open(os.environ["AUDIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.addaudithook(_reads(root, fd))
    module = os.environ.get("AUDIT_MODULE")  # another trainer than the example, by module
    if module:
        sys.argv = [module, *sys.argv[1:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    sys.argv = [str(EXAMPLE), *sys.argv[1:]]
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
