"""One copy on disk of a layer that several kind nodes unpacked: identical files hard-linked.

Why: a kind cluster's nodes are containers of one docker daemon, and each node's containerd
keeps its store in the node's /var volume, all on the host's disk. Every node that runs
Elastra's worker unpacks the same 5.6 GiB torch layer, so three worker nodes held three
copies, which together with the rest of `make test` outgrew the free disk of some machines
(CI once stopped at "no space left on device" while unpacking into the third node). An
unpacked layer is read-only: it is an overlayfs lower directory, and a container that writes
one of its files writes a copy in its own upper directory. So the files of the same layer in
two nodes can be one inode, and the second and later nodes cost next to nothing.

Only files whose size, mode, owner and modification time agree are linked: both trees are the
same layer (same chain ID) unpacked from the same archive, so anything else means the trees
are not what the caller says, and such files are left as they are.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Linked:
    """What link_identical shared: files now hard links into the reference, and their bytes."""

    files: int = 0
    bytes: int = 0

    def __add__(self, other: Linked) -> Linked:
        return Linked(self.files + other.files, self.bytes + other.bytes)


def same_file_contents(a: os.stat_result, b: os.stat_result) -> bool:
    """Two regular files of the same layer unpacked twice (not already one inode)."""
    return (
        stat.S_ISREG(a.st_mode)
        and stat.S_ISREG(b.st_mode)
        and (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino)
        and a.st_dev == b.st_dev
        and a.st_size == b.st_size
        and a.st_mode == b.st_mode
        and (a.st_uid, a.st_gid) == (b.st_uid, b.st_gid)
        and a.st_mtime_ns == b.st_mtime_ns
    )


def link_identical(reference: Path, target: Path) -> Linked:
    """Replace each regular file under `target` by a hard link to the same path under
    `reference` when same_file_contents says they are the same file unpacked twice.

    The reference is another node's live store: a file its containerd removes meanwhile is
    skipped, and one it removes later lives on as long as `target` links it. Raises OSError
    (EXDEV) when the two trees are not under one mount.

    The replacement is atomic per file (a link under a temporary name, then rename), so a
    reader of `target` sees the old file or the new link, never no file.
    """
    linked = Linked()
    for dirpath, _dirs, names in os.walk(target):
        here = Path(dirpath)
        there = reference / here.relative_to(target)
        for name in names:
            mine, theirs = here / name, there / name
            try:
                a, b = mine.lstat(), theirs.lstat()
            except FileNotFoundError:
                continue
            if not same_file_contents(a, b):
                continue
            temporary = here / f".{name}.elastra-link"
            try:
                os.link(theirs, temporary)
            except FileExistsError:  # a file of the layer by that name: leave both alone
                continue
            except FileNotFoundError:  # the reference's containerd removed it meanwhile
                continue
            os.replace(temporary, mine)
            linked += Linked(1, a.st_size)
    return linked
