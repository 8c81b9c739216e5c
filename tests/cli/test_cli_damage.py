"""The LMDB page helpers for the tests of other subjects that import them from here; they live in
tests/cli/lmdb_pages.py, and the tests of damaged pages in test_offline_commands_on_damaged_pages.py."""

from tests.cli.lmdb_pages import IS_LEAF, Pages

__all__ = ["IS_LEAF", "Pages"]
