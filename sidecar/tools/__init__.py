"""Offline tools on a data directory: verify and its cross-checks, backup, the isolated readers."""

from .backup import write_backup
from .crosscheck import Problem

__all__ = ["Problem", "write_backup"]
