"""`ckpt`'s entry point: read the command line, run its command, and turn what it raised into an exit status.

Errors go to stderr: exit status 1 when the command fails, 2 for a bad command line or configuration.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from ..errors import StoreError
from .parser import parse_args

#: Each command's module (in this package) and function. A module is imported only when its command
#: runs: `ckpt get` (what an agent shells out to) loads neither the store engine, the server nor the tools.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve_command", "serve_command"),
    "put": ("client_commands", "put"),
    "get": ("client_commands", "get"),
    "history": ("client_commands", "history"),
    "sessions": ("client_commands", "sessions"),
    "fork": ("client_commands", "fork"),
    "delete": ("client_commands", "delete"),
    "register-type": ("client_commands", "register_type"),
    "blob": ("blob_commands", "blob"),
    "events": ("event_commands", "events"),
    "inspect": ("offline_commands", "inspect"),
    "verify": ("verify_command", "verify"),
    "stats": ("offline_commands", "stats"),
    "backup": ("offline_commands", "backup"),
    "compact": ("offline_commands", "compact"),
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs the command ``name``, its module imported."""
    module, function = COMMANDS[name]
    run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(f".{module}", __package__), function)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # listed in --help; the `ckpt` command (ckpt/command.py) hands it to bench/
        print("ckpt bench: run it as `ckpt bench` (or `python -m ckpt bench`)", file=sys.stderr)
        return 2
    args = parse_args(argv)
    run = command(args.command)
    try:
        _check_stdout(args)
        return int(run(args))
    except BrokenPipeError:
        # The reader went away (`ckpt history s | head -1`): stop quietly, as
        # other tools do, without a second error when Python flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as the shell would report it
    except (StoreError, OSError) as exc:
        print(f"ckpt {args.command}: {_failure(exc, args)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"ckpt {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # The client's errors are imported only now: the client imports grpc, which `ckpt serve`
        # loads only once it has started its store process. (A command that raised one loaded it.)
        from ..client import CheckpointError

        if not isinstance(exc, CheckpointError):
            raise
        print(f"ckpt {args.command}: {_failure(exc, args)}", file=sys.stderr)
        return 1


def _check_stdout(args: argparse.Namespace) -> None:
    """OSError if the command prints to stdout and it is closed: every one but serve and a get --out does."""
    if args.command != "serve" and getattr(args, "out", None) is None:
        from .output import require_stdout

        require_stdout()


def _failure(exc: Exception, args: argparse.Namespace) -> str:
    """What a failed command says: the error, and where a sidecar could not be reached, what to check."""
    from ..client import CheckpointError, UnavailableError
    from .output import sentence

    message, hint = sentence(exc), ""
    if isinstance(exc, UnavailableError) and "failed to connect" in message:
        hint = _connect_hint(message, args)
    if isinstance(exc, CheckpointError):  # the client's limit, as this command sets it
        message = message.replace("max_message_bytes", "--max-message-bytes")
    return message + hint


def _connect_hint(message: str, args: argparse.Namespace) -> str:
    """What to check when no connection was made, by what gRPC said of the last attempt."""
    tls = any(getattr(args, name, None) for name in ("tls_ca_file", "tls_client_cert_file"))
    if "WRONG_VERSION_NUMBER" in message:  # a TLS client's hello answered in plaintext
        return "; the sidecar there serves plaintext: drop the --tls-* options"
    if "Hostname Verification Check failed" in message:
        return "; its certificate does not name that host (--tls-server-name gives the name to check)"
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return "; the sidecar's certificate was refused (is --tls-ca-file the CA that signed it?)"
    if tls and "Socket closed" in message:
        # A mutual-TLS sidecar closes a handshake whose client certificate it does not take: all the client sees.
        if getattr(args, "tls_client_cert_file", None):
            return (
                "; if it takes only client certificates from its CA (mutual TLS), check that"
                " --tls-client-cert-file is signed by that CA and not expired"
            )
        return (
            "; if it asks for a client certificate (mutual TLS), give --tls-client-cert-file and --tls-client-key-file"
        )
    hint = "; is `ckpt serve` running there? (the address is --target, else the socket in --data-dir)"
    if args.target and not args.target.startswith("unix") and not tls:
        hint += "; if it serves TLS, give --tls-ca-file"
    return hint


if __name__ == "__main__":
    sys.exit(main())
