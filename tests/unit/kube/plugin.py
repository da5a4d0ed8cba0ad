"""A fake exec credential plugin, written out by tests: it prints an ExecCredential and counts runs.

The test writes this file with a ``#!`` line for the test's own Python, sets ``PLUGIN_STATE``
to a directory, and reads ``calls`` there. ``PLUGIN_TOKEN`` is the token to hand out (a
``{n}`` in it becomes the call number); ``PLUGIN_EXPIRES`` an RFC 3339 expiry, if any; the
``KUBERNETES_EXEC_INFO`` the plugin received is saved as ``exec-info.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def main() -> None:
    state = Path(os.environ["PLUGIN_STATE"])
    counter = state / "calls"
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    (state / "exec-info.json").write_text(os.environ.get("KUBERNETES_EXEC_INFO", ""))
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    status = {"token": os.environ.get("PLUGIN_TOKEN", "token-{n}").replace("{n}", str(calls))}
    if os.environ.get("PLUGIN_EXPIRES"):
        status["expirationTimestamp"] = os.environ["PLUGIN_EXPIRES"]
    credential = {"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}
    print(json.dumps(credential))


if __name__ == "__main__":
    main()
