"""What each image's processes import at start, in a fresh interpreter: the agent, the
assignment and the operator never ask for torch; the operator starts without the kubernetes
client (only the tests import it: it is not in the operator image).

pyproject.toml's import contracts read the import statements; this runs the imports, so it
also sees a package ``__init__`` (``elastra_worker`` hands out ``Session`` lazily, through
``__getattr__``) and what an import runs when it happens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import importlib, json, sys

asked = []


class Absent:
    # torch and the kubernetes client as an image without them: importing fails; asking
    # for torch at all is recorded (Kopf asks for the kubernetes client and does without).
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ("torch", "kubernetes"):
            asked.append(name)
            raise ImportError(f"{name} is not in the image")
        return None


sys.meta_path.insert(0, Absent())
importlib.import_module(sys.argv[1])
print(json.dumps({"torch": sorted(n for n in asked if n.partition(".")[0] == "torch")}))
"""

WITHOUT_TORCH = [
    "elastra_worker.agent",
    "elastra_worker.assignment",
    "elastra_worker.cli",  # the worker image's entrypoint runs the agent
    "elastra.cli",  # the operator image's entrypoint (elastra run)
    "elastra.commands.run",
    "elastra.controller.engine.operator",
]


def probe(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, module],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("module", WITHOUT_TORCH)
def test_importing_asks_for_neither_torch_nor_a_missing_kubernetes_client(module: str) -> None:
    done = probe(module)
    assert done.returncode == 0, (
        f"import {module} failed without torch or kubernetes:\n{done.stderr}"
    )
    assert json.loads(done.stdout) == {"torch": []}, f"import {module} asked for torch"


def test_the_probe_sees_a_module_that_imports_torch() -> None:
    """The check can fail: the GPU check of a trainer imports torch at once."""
    done = probe("elastra_worker.devices")
    assert done.returncode != 0 and "torch is not in the image" in done.stderr
