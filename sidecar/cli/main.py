"""`ckpt`'s entry point: read the command line, run its command, and turn what it raised into an exit status.

Errors go to stderr: exit status 1 when the command fails, 2 for a bad command line or configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ..client import CheckpointError, UnavailableError
from ..errors import StoreError
from . import blob_commands, client_commands, event_commands, offline_commands
from .output import sentence
from .parser import parse_args
from .serve_command import serve_command
from .verify_command import verify

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": serve_command,
    "put": client_commands.put,
    "get": client_commands.get,
    "history": client_commands.history,
    "sessions": client_commands.sessions,
    "fork": client_commands.fork,
    "delete": client_commands.delete,
    "register-type": client_commands.register_type,
    "blob": blob_commands.blob,
    "events": event_commands.events,
    "inspect": offline_commands.inspect,
    "verify": verify,
    "stats": offline_commands.stats,
    "backup": offline_commands.backup,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # listed in --help; the `ckpt` command (ckpt/command.py) hands it to bench/
        print("ckpt bench: run it as `ckpt bench` (or `python -m ckpt bench`)", file=sys.stderr)
        return 2
    args = parse_args(argv)
    try:
        return int(COMMANDS[args.command](args))
    except BrokenPipeError:
        # The reader went away (`ckpt history s | head -1`): stop quietly, as
        # other tools do, without a second error when Python flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as the shell would report it
    except (CheckpointError, StoreError, OSError) as exc:
        print(f"ckpt {args.command}: {_failure(exc, args)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"ckpt {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _failure(exc: Exception, args: argparse.Namespace) -> str:
    """What a failed command says: the error, and where a sidecar could not be reached, what to check."""
    message, hint = sentence(exc), ""
    if isinstance(exc, UnavailableError) and "failed to connect" in message:
        hint = "; is `ckpt serve` running there? (the address is --target, else the socket in --data-dir)"
        if (
            args.target
            and not args.target.startswith("unix")
            and not any(getattr(args, name, None) for name in ("tls_ca_file", "tls_client_cert_file"))
        ):
            hint += "; if it serves TLS, give --tls-ca-file"
    if isinstance(exc, CheckpointError):  # the client's limit, as this command sets it
        message = message.replace("max_message_bytes", "--max-message-bytes")
    return message + hint


if __name__ == "__main__":
    sys.exit(main())
