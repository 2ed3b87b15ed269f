"""One tool call in its own process: ``python -m rft.workflow.tool_worker pkg.module:function``
reads the JSON arguments on stdin and writes ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "..."}`` on stdout. Imports only the stdlib and the tool's module."""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    module_name, _, attr = sys.argv[1].partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
        result = fn(**json.loads(sys.stdin.read() or "{}"))
        out = {"ok": True, "result": result}
        text = json.dumps(out)
    except Exception as e:  # the tool's failure is the model's observation, not ours
        text = json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
