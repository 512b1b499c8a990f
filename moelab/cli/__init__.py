"""The typer command line: a thin layer over the library.

Before typer or any command's module is imported, the installed dependencies are held to moelab's floors
(moelab.core.floors): one below its floor is one `error:` line and exit 2, never the ImportError or binder
error it would cause deep inside a command."""

import sys

from moelab.core.floors import floors_message

_below = floors_message()
if _below is not None:
    print(f"error: {_below}", file=sys.stderr)
    raise SystemExit(2)
