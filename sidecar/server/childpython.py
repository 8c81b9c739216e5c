"""How the sidecar starts a Python process of its own (a store process, a ``--workers`` worker).

The child imports the ckpt package this process imported, wherever that is: site-packages, a
checkout, or a folder only this process's sys.path names (a script's ``sys.path.insert``, a
``pip install --target`` folder). So its folder leads the child's PYTHONPATH, and ``-P`` keeps the
working directory off the child's sys.path: a ckpt/ folder there is not the package this one runs.
Standard library imports only: storespawn.py starts the store process before the server's imports.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The folder holding the ckpt package. Not resolved: in a checkout this file is reached through the
# ckpt/sidecar link, whose folder holds ckpt/.
PACKAGE_ROOT = Path(__file__).parents[3]


def python_module_command(module: str) -> list[str]:
    """The command running ``python -m module`` with this interpreter, without the working directory."""
    return [sys.executable, "-P", "-m", module]


def child_environment() -> dict[str, str]:
    """This process's environment, with the folder holding its ckpt package first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return env
