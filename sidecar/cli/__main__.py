"""`python -m ckpt.sidecar.cli`: the `ckpt` command."""

import sys

from .main import main

sys.exit(main())
