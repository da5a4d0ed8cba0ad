"""`python -m e2e.images build|save|import|tag NAME...` (NAME: pause, worker, operator)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from .build import BUILDERS, import_image, save, say


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.images")
    parser.add_argument("command", choices=["build", "save", "import", "tag"])
    parser.add_argument("names", nargs="+", choices=sorted(BUILDERS))
    parser.add_argument("--address", help="containerd socket (import)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for `save` tarballs")
    args = parser.parse_args(argv)
    if args.command == "import" and not args.address:
        parser.error("import needs --address (the node's containerd socket)")
    try:
        for name in args.names:
            if args.command == "tag":
                print(BUILDERS[name]().tag)
                continue
            started = time.monotonic()
            image = BUILDERS[name]()
            say(
                f"{image.tag}: {len(image.layers)} layers, {image.size / 2**20:.0f} MiB "
                f"({time.monotonic() - started:.1f}s)"
            )
            if args.command == "save":
                out = args.out / f"{name}.tar"
                save(image, out)
                say(f"{image.tag}: saved to {out}")
            elif args.command == "import":
                import_image(image, address=args.address)
    except subprocess.CalledProcessError as err:
        print(f"images: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
