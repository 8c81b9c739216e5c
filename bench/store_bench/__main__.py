"""``python -m ckpt.bench.store_bench``: the store benchmarks' command line (see ``cli``)."""

import sys

from .cli import main

sys.exit(main())
