"""`python -m ckpt`: the `ckpt` command."""

import sys

from ckpt.command import main

sys.exit(main())
