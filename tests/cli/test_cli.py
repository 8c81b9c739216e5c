"""`ckpt()` for the tests of other subjects that import it from here; the command line's tests are in this
folder's other files, by subject, and ``ckpt()`` lives in tests/cli/command.py."""

from tests.cli.command import ckpt

__all__ = ["ckpt"]
