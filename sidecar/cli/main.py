"""The `ckpt` command line.

    ckpt serve [--data-dir DIR] [--listen ADDR ...]      run the sidecar
    ckpt put SESSION [FILE] [--merge]                    write a version (FILE or stdin)
    ckpt get SESSION [--version N] [--out FILE]          read a version (to stdout or FILE)
    ckpt history SESSION                                 list versions, newest first
    ckpt sessions [--label K=V] [--updated-after T]      list sessions (filters: labels, update time)
    ckpt fork SESSION NEW_SESSION [--version N]          fork a session
    ckpt delete SESSION                                  delete a session
    ckpt inspect SESSION [--data-dir DIR]                frames of a session: kinds, sizes, chains
    ckpt verify [SESSION ...] [--data-dir DIR]           check every frame, chain and index entry; exit 1 on failure
    ckpt stats [--data-dir DIR]                          store statistics as JSON
    ckpt backup DEST [--data-dir DIR]                    consistent copy of the data directory into DEST

put/get/history/sessions/fork/delete talk to a running sidecar (--target, default the
unix socket in --data-dir); inspect/verify/stats/backup read a data directory
directly (read-only, safe beside a running sidecar). Every `serve` option,
--data-dir and --target have an environment variable (shown in --help).
Errors go to stderr: exit status 1 when the command fails, 2 for a bad
command line or configuration.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import lmdb
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from ...codec import DecodeError, FrameKind, iter_versions
from ..client import CheckpointClient, CheckpointError, UnavailableError
from ..config import DEFAULT_MAX_MESSAGE_BYTES, EVENT_LOOPS, Durability, Retention, ServeConfig, StoreConfig
from ..errors import DataLoss, InvalidArgument, NotFound, StoreError
from ..server import serve
from ..store import SessionInfo, Store, VersionInfo, keys
from ..tls import ClientTLS
from ..tools import Problem, isolated, write_backup

DEFAULT_DATA_DIR = "data"
# `ckpt serve` defaults are ServeConfig's own, so the two cannot drift apart.
_SERVE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ServeConfig)}


def _size_text(nbytes: int) -> str:
    """A default size for --help, in the largest binary unit it is a whole number of."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} bytes"


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(f"CKPT_{name}", default)


def _env_default(name: str, default: Any) -> Any:
    """An option's default: CKPT_<name> if set, as text, else ``default``.

    argparse converts a text default with the option's ``type`` only when the
    option is used, so a bad variable is reported like a bad option, and only
    by the command that reads it.
    """
    value = _env(name)
    return value if value not in (None, "") else default


def _number(kind: Callable[[str], Any], env_name: str) -> Callable[[str], Any]:
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (from the option or CKPT_{env_name})") from None

    return parse


def _choice(values: list[str], env_name: str) -> Callable[[str], str]:
    # argparse checks `choices` against what is typed, not against a default
    # taken from the environment: this names the variable and the choices.
    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(values)} (from the option or CKPT_{env_name})"
            )
        return text

    return parse


def _in_option_terms(message: str, args: argparse.Namespace) -> str:
    """A configuration error with its field names spelled as the options that set them."""
    for name in vars(args):
        if name != "command":
            message = re.sub(rf"\b{name}\b", "--" + name.replace("_", "-"), message)
    # An option left out is the config's None.
    return message.replace(" or None, got", " (or left out), got")


def _version() -> str:
    try:
        return importlib.metadata.version("ckpt")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckpt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"ckpt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def data_dir_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data-dir",
            type=Path,
            default=Path(_env("DATA_DIR", DEFAULT_DATA_DIR)),
            help="data directory (env CKPT_DATA_DIR; default ./data)",
        )

    def env_option(
        p: argparse.ArgumentParser,
        flag: str,
        kind: Callable[[str], Any] | list[str],
        default: Any,
        help_text: str,
        *,
        shown: str | None,
    ) -> None:
        """``flag``, also set by CKPT_<its name>, which is checked as the option is; ``kind`` is int,
        float, or the choices. The help ends naming the variable and ``shown``, the default."""
        env = flag.removeprefix("--").replace("-", "_").upper()
        checked: dict[str, Any] = (
            {"choices": kind, "type": _choice(kind, env)} if isinstance(kind, list) else {"type": _number(kind, env)}
        )
        where = f"env CKPT_{env}" + (f"; default {shown}" if shown is not None else "")
        p.add_argument(flag, default=_env_default(env, default), help=f"{help_text} ({where})", **checked)

    def target_arg(p: argparse.ArgumentParser) -> None:
        data_dir_arg(p)
        p.add_argument(
            "--target",
            default=_env("TARGET"),
            help="sidecar address, unix:/path or host:port (env CKPT_TARGET; default the socket in --data-dir)",
        )
        env_option(
            p,
            "--max-message-bytes",
            int,
            DEFAULT_MAX_MESSAGE_BYTES,
            "largest message this command sends or takes; raise it with the sidecar's --max-message-bytes (the"
            " same variable) for larger states",
            shown=_size_text(DEFAULT_MAX_MESSAGE_BYTES),
        )
        for flag, help_text in (
            ("--tls-ca-file", "connect with TLS to a host:port --target, trusting this PEM CA"),
            ("--tls-client-cert-file", "this client's PEM certificate, for a sidecar that requires one"),
            ("--tls-client-key-file", "the private key of --tls-client-cert-file (PEM)"),
            ("--tls-server-name", "check the sidecar's certificate against this name, not --target's host"),
        ):
            env = flag.removeprefix("--").replace("-", "_").upper()
            p.add_argument(
                flag,
                metavar="NAME" if flag == "--tls-server-name" else "FILE",
                default=_env_default(env, None),
                help=f"{help_text} (env CKPT_{env})",
            )

    s = sub.add_parser("serve", help="run the sidecar", description="Run the gRPC sidecar until SIGTERM/SIGINT.")
    data_dir_arg(s)
    s.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="ADDR",
        help="unix:/path or host:port; repeatable (env CKPT_LISTEN, comma-separated; default unix:DATA_DIR/ckpt.sock)",
    )
    for flag, help_text in (
        (
            "--tls-cert-file",
            "serve TLS on every host:port address with this PEM certificate chain (unix sockets stay plaintext)",
        ),
        ("--tls-key-file", "the private key of --tls-cert-file (PEM)"),
        ("--tls-client-ca-file", "with TLS, take only clients whose certificate this PEM CA signed (mutual TLS)"),
    ):
        env = flag.removeprefix("--").replace("-", "_").upper()
        s.add_argument(
            flag,
            type=Path,
            metavar="FILE",
            default=_env_default(env, None),
            help=f"{help_text} (env CKPT_{env}; default off)",
        )
    defaults = _SERVE_DEFAULTS
    env_option(s, "--metrics-port", int, None, "serve Prometheus metrics on METRICS_ADDRESS:PORT", shown="off")
    env_option(
        s,
        "--metrics-address",
        str,
        "127.0.0.1",
        "where metrics listen: 0.0.0.0 or :: to be scraped from outside a container",
        shown="127.0.0.1",
    )
    env_option(
        s,
        "--max-message-bytes",
        int,
        defaults["max_message_bytes"],
        "largest message in either direction",
        shown=_size_text(defaults["max_message_bytes"]),
    )
    env_option(
        s,
        "--durability",
        [mode.value for mode in Durability],
        defaults["durability"].value,
        "sync: fsync every commit; no-meta-sync: one fsync a commit instead of two, an OS crash may undo"
        " the last commits",
        shown=defaults["durability"].value,
    )
    env_option(
        s,
        "--cache-size-bytes",
        int,
        defaults["cache_size_bytes"],
        "memory for latest states",
        shown=_size_text(defaults["cache_size_bytes"]),
    )
    env_option(
        s,
        "--encoder-cache-bytes",
        int,
        defaults["encoder_cache_bytes"],
        "memory for recently written sessions' encoders (head state and zstd stream), so their next write"
        " needs no LMDB read",
        shown=_size_text(defaults["encoder_cache_bytes"]),
    )
    env_option(
        s,
        "--reply-cache-bytes",
        int,
        defaults["reply_cache_bytes"],
        "memory the gRPC process keeps replies to latest-version Gets in, to answer them again without the"
        " store process while they are still the committed head (0: off)",
        shown=_size_text(defaults["reply_cache_bytes"]),
    )
    env_option(
        s,
        "--max-map-size-bytes",
        int,
        defaults["max_map_size_bytes"],
        "cap on the LMDB map",
        shown=_size_text(defaults["max_map_size_bytes"]),
    )
    env_option(
        s,
        "--max-queued-write-bytes",
        int,
        defaults["max_queued_write_bytes"],
        "most bytes of states waiting for the writer; past it a unary Put fails UNAVAILABLE at once (clients"
        " retry) and a PutStream waits",
        shown=_size_text(defaults["max_queued_write_bytes"]),
    )
    env_option(
        s,
        "--max-commit-delay-seconds",
        float,
        defaults["max_commit_delay_seconds"],
        "longest a commit waits for the writers the last one answered (at most that commit's duration), so"
        " more writes share one flush; 0 = commit what is queued at once, for the lowest latency",
        shown=f"{defaults['max_commit_delay_seconds']:g}",
    )
    env_option(
        s,
        "--threads",
        int,
        defaults["threads"],
        "threads for store calls that may block: cache-miss reads, listings, forks, deletes; RPCs run on"
        " one event loop",
        shown=str(defaults["threads"]),
    )
    env_option(
        s,
        "--workers",
        int,
        defaults["workers"],
        "sidecar processes serving the data directory on the same TCP ports (--listen host:port only);"
        " each has its own event loop and writer: more throughput from many client connections",
        shown=str(defaults["workers"]),
    )
    env_option(
        s,
        "--event-loop",
        list(EVENT_LOOPS),
        defaults["event_loop"],
        "the event loop RPCs run on: uvloop (libuv's, less CPU per RPC) or asyncio (the standard library's)",
        shown=defaults["event_loop"],
    )
    env_option(
        s,
        "--grace-seconds",
        float,
        defaults["grace_seconds"],
        "time in-flight RPCs get on shutdown",
        shown=f"{defaults['grace_seconds']:g}",
    )
    env_option(
        s,
        "--heap-trim-interval-seconds",
        float,
        defaults["heap_trim_interval_seconds"],
        "this often, if anything was served since the last time, give the C heap's free memory back to the"
        " OS (glibc malloc_trim), which glibc otherwise keeps after a burst; while on, freed blocks up to"
        " 32 MiB are kept for reuse until the next trim rather than unmapped at once; 0 = never",
        shown=f"{defaults['heap_trim_interval_seconds']:g}",
    )
    env_option(s, "--keep-last-versions", int, None, "retention: keep at least the newest N versions", shown=None)
    env_option(
        s,
        "--keyframe-after-quiet-seconds",
        float,
        None,
        "once a session has written nothing this long, rewrite its head as a FULL frame (same state), so"
        " the cold read that resumes it decodes one frame",
        shown="off",
    )
    env_option(
        s,
        "--request-id-ttl-seconds",
        float,
        defaults["request_id_ttl_seconds"],
        "how long a write's request id answers its retries with the first result; a retry later than this"
        " writes again, so make it longer than any client keeps retrying",
        shown=f"{defaults['request_id_ttl_seconds']:g}, a day",
    )
    env_option(
        s,
        "--sweep-interval-seconds",
        float,
        defaults["sweep_interval_seconds"],
        "how often the background sweeper applies retention, frees expired request ids and writes quiet keyframes",
        shown=f"{defaults['sweep_interval_seconds']:g}",
    )
    env_option(s, "--max-version-age-seconds", float, None, "retention: drop versions older than this", shown=None)
    s.add_argument(
        "--merge-message-type",
        metavar="TYPE",
        default=_env("MERGE_MESSAGE_TYPE", None) or None,
        help="compact MERGE states as this protobuf message type (e.g. ckpt.v1.Checkpoint) at each chain start, so"
        " fields that later patches overwrite do not pile up; MERGE patches must then parse as TYPE"
        " (env CKPT_MERGE_MESSAGE_TYPE; default off: a MERGE state is every patch concatenated)",
    )
    s.add_argument(
        "--store-process",
        action=argparse.BooleanOptionalAction,
        default=_env("STORE_PROCESS", "1") != "0",
        help="run the store in a process of its own, this one forwarding each call to it: the store's writer"
        " and gRPC's event loop then do not share a GIL, and run on two cores; --no-store-process serves"
        " everything from one process (env CKPT_STORE_PROCESS=0; default on)",
    )
    s.add_argument(
        "--bench-echo",
        action="store_true",
        default=_env("BENCH_ECHO", "") == "1",
        help="also serve the benchmarks' echo methods: /ckpt.bench.Echo/Echo, and LinkEcho, which goes by way of"
        " the store process (env CKPT_BENCH_ECHO=1)",
    )

    p = sub.add_parser("put", help="write a version", description="Write a version from FILE or stdin.")
    target_arg(p)
    p.add_argument("session")
    p.add_argument("file", nargs="?", default="-", help="state bytes (default: stdin)")
    p.add_argument("--merge", action="store_true", help="MERGE: the input is a patch merged onto the latest state")
    p.add_argument("--expected-version", type=int, default=None, help="compare-and-set on the head")
    p.add_argument("--request-id", default=None, help="idempotency key (default: generated)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="repeatable")

    g = sub.add_parser("get", help="read a version", description="Write a version's state bytes to stdout or FILE.")
    target_arg(g)
    g.add_argument("session")
    g.add_argument("--version", type=int, default=0, help="version (default: latest)")
    g.add_argument("--out", type=Path, default=None, help="write here instead of stdout")

    h = sub.add_parser("history", help="list versions", description="List a session's versions, newest first.")
    target_arg(h)
    h.add_argument("session")

    ls = sub.add_parser(
        "sessions",
        help="list sessions",
        description="List sessions (one JSON object a line); with filters, the sessions carrying every --label"
        " and last written in [--updated-after, --updated-before). In session id order, except with time"
        " filters and no --label: in order of last write (to about a second, then by id).",
    )
    target_arg(ls)
    ls.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    ls.add_argument("--updated-after", default=None, metavar="TIME", help="ISO 8601 with a UTC offset or Z")
    ls.add_argument("--updated-before", default=None, metavar="TIME", help="ISO 8601 with a UTC offset or Z")

    f = sub.add_parser("fork", help="fork a session", description="Create NEW_SESSION from a version of SESSION.")
    target_arg(f)
    f.add_argument("session")
    f.add_argument("new_session")
    f.add_argument("--version", type=int, default=0, help="version to fork (default: latest)")

    d = sub.add_parser("delete", help="delete a session", description="Delete a session and all its versions.")
    target_arg(d)
    d.add_argument("session")

    i = sub.add_parser(
        "inspect",
        help="show a session's frames",
        description="Show a session's versions: frame kinds, sizes and chain positions (offline).",
    )
    data_dir_arg(i)
    i.add_argument("session")

    v = sub.add_parser(
        "verify",
        help="check every frame",
        description="Check every frame's checksum and chain links, then cross-check the session records against"
        " the frames table and the index tables (update time, labels, request ids and their expiry); offline. With"
        " SESSIONs, only those sessions and the index entries naming them. Exit 1 on any failure.",
    )
    data_dir_arg(v)
    v.add_argument("sessions", nargs="*", help="sessions to check (default: all)")

    st = sub.add_parser("stats", help="store statistics", description="Print store statistics as JSON (offline).")
    data_dir_arg(st)

    b = sub.add_parser(
        "backup",
        help="back up the data directory",
        description="Copy the data directory into DEST, a new directory, as of one snapshot: every write"
        " acknowledged before the backup began, none half-made; free pages are left out. Safe beside a running"
        " sidecar. DEST is a data directory itself: `ckpt serve --data-dir DEST` serves it, `ckpt verify"
        " --data-dir DEST` checks it. Prints what it holds as JSON.",
    )
    data_dir_arg(b)
    b.add_argument("dest", type=_backup_dest, help="the backup's directory (must not exist; its parent must)")
    # `ckpt bench ...` is handed whole to the harness (bench/harness/main.py), which has its own --help;
    # listed here for the overview only, so the sidecar never imports the benchmark code.
    sub.add_parser("bench", help="benchmark harness: ckpt against other stores (ckpt bench --help)", add_help=False)
    parser.commands = sub.choices  # type: ignore[attr-defined]  # for _parse_args
    return parser


def _parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, but a command's options may also come after its positional arguments.

    argparse alone settles an optional positional at the first run of
    positionals, so ``ckpt put s --merge patch.bin`` used to fail with
    "unrecognized arguments: patch.bin" (and ``ckpt verify s1 --data-dir d s2``
    likewise). The command's own parser reads its arguments intermixed; its
    errors name the command (``ckpt put: error: ...``). After ``--`` every
    argument is positional (``ckpt get -- -odd-id``), which the intermixed
    reading does not support (Python 3.11), so such a command line is read
    the plain way.
    """
    commands: dict[str, argparse.ArgumentParser] = parser.commands  # type: ignore[attr-defined]
    if argv and argv[0] in commands:
        command, namespace = commands[argv[0]], argparse.Namespace(command=argv[0])
        if "--" in argv:
            return command.parse_args(argv[1:], namespace=namespace)
        return command.parse_intermixed_args(argv[1:], namespace=namespace)
    return parser.parse_args(argv)  # no command, an unknown one, or -h: the overview's usage and errors


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        try:
            from ...bench.harness.main import main as bench_main
        except ModuleNotFoundError as exc:  # an installed image ships the sidecar, not bench/
            print(
                f"ckpt bench: the benchmark harness is not installed here ({exc}); run it from a source checkout",
                file=sys.stderr,
            )
            return 1
        return bench_main(argv[1:])
    args = _parse_args(_parser(), argv)
    try:
        return int(COMMANDS[args.command](args))
    except BrokenPipeError:
        # The reader went away (`ckpt history s | head -1`): stop quietly, as
        # other tools do, without a second error when Python flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as the shell would report it
    except (CheckpointError, StoreError, OSError) as exc:
        message, hint = _sentence(exc), ""
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
        print(f"ckpt {args.command}: {message}{hint}", file=sys.stderr)
        return 1
    except lmdb.Error as exc:  # a damaged LMDB file (inspect/verify/stats): say so, no traceback
        print(f"ckpt {args.command}: the LMDB database in {args.data_dir} is damaged: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"ckpt {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    listen = args.listen or [a for a in (_env("LISTEN", "") or "").split(",") if a.strip()]
    try:
        config = _serve_config(args, listen)
    except ValueError as exc:
        raise ValueError(_in_option_terms(str(exc), args)) from None
    return serve(config)


def _serve_config(args: argparse.Namespace, listen: list[str]) -> ServeConfig:
    retention = Retention(
        keep_last_versions=args.keep_last_versions, max_version_age_seconds=args.max_version_age_seconds
    )
    return ServeConfig(
        data_dir=args.data_dir,
        listen=tuple(a.strip() for a in listen),
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        max_message_bytes=args.max_message_bytes,
        durability=Durability(args.durability),
        cache_size_bytes=args.cache_size_bytes,
        encoder_cache_bytes=args.encoder_cache_bytes,
        reply_cache_bytes=args.reply_cache_bytes,
        max_map_size_bytes=args.max_map_size_bytes,
        max_queued_write_bytes=args.max_queued_write_bytes,
        max_commit_delay_seconds=args.max_commit_delay_seconds,
        keyframe_after_quiet_seconds=args.keyframe_after_quiet_seconds,
        request_id_ttl_seconds=args.request_id_ttl_seconds,
        sweep_interval_seconds=args.sweep_interval_seconds,
        heap_trim_interval_seconds=args.heap_trim_interval_seconds,
        threads=args.threads,
        grace_seconds=args.grace_seconds,
        event_loop=args.event_loop,
        workers=args.workers,
        retention=retention,
        merge_message_type=args.merge_message_type,
        bench_echo=args.bench_echo,
        store_process=args.store_process,
    )


def _client(args: argparse.Namespace) -> CheckpointClient:
    # Ids are checked here, by the sidecar's own rules, so that a bad one is a
    # bad command line (exit 2), said at once: not an error from the sidecar,
    # nor, with none running, retried for ~2.6 s and reported as a connection failure.
    for name, field in (("session", "SESSION"), ("new_session", "NEW_SESSION")):
        value = getattr(args, name, None)
        if value is not None:
            try:
                keys.session_key(value, field=field)
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
    target = args.target or f"unix:{args.data_dir.resolve() / 'ckpt.sock'}"
    try:
        return CheckpointClient(target, max_message_bytes=args.max_message_bytes, tls=_client_tls(args))
    except ValueError as exc:
        raise ValueError(_in_option_terms(str(exc), args)) from None


def _client_tls(args: argparse.Namespace) -> ClientTLS | bool:
    files = (args.tls_ca_file, args.tls_client_cert_file, args.tls_client_key_file)
    if all(f is None for f in files):
        if args.tls_server_name is not None:
            raise ValueError("--tls-server-name needs --tls-ca-file (or the client certificate options)")
        return False
    return ClientTLS.from_files(
        ca_file=args.tls_ca_file,
        cert_file=args.tls_client_cert_file,
        key_file=args.tls_client_key_file,
        server_name=args.tls_server_name,
    )


def _labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r} is not KEY=VALUE (a non-empty KEY)")
        out[key] = value
    try:
        keys.check_labels(out, field="--label")
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    return out


def _put(args: argparse.Namespace) -> int:
    labels = _labels(args.label)
    if args.file == "-" and sys.stdin.isatty():
        raise ValueError("no FILE given and stdin is a terminal: name a FILE, or pipe the state in")
    with _client(args) as c:  # the ids are checked before the state is read
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        write = c.merge if args.merge else c.put
        r = write(args.session, data, expected_version=args.expected_version, request_id=args.request_id, labels=labels)
    _print_json(r)
    return 0


def _get(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.get(args.session, args.version)
    if args.out:
        args.out.write_bytes(r.state)
        print(f"version {r.version}: {len(r.state)} bytes -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(r.state)
        sys.stdout.flush()
    return 0


def _history(args: argparse.Namespace) -> int:
    with _client(args) as c:
        for info in c.history(args.session):
            _print_json(info)
    return 0


def _time_arg(option: str, text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option} {text!r} is not an ISO 8601 time (e.g. 2026-11-21T09:30:00Z)") from None
    if when.tzinfo is None:
        raise ValueError(f"{option} {text!r} has no UTC offset; add Z or e.g. +01:00")
    return when


def _sessions(args: argparse.Namespace) -> int:
    labels = _labels(args.label)
    after = _time_arg("--updated-after", args.updated_after)
    before = _time_arg("--updated-before", args.updated_before)
    with _client(args) as c:
        for info in c.sessions(labels=labels, updated_after=after, updated_before=before):
            _print_json(info)
    return 0


def _fork(args: argparse.Namespace) -> int:
    with _client(args) as c:
        _print_json(c.fork(args.session, args.new_session, version=args.version))
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _client(args) as c:
        print(json.dumps({"deleted_versions": c.delete(args.session)}))
    return 0


def _open_readonly(data_dir: Path) -> Store:
    try:  # the store refuses a truncated data file itself (reading it could end in SIGBUS)
        return Store(StoreConfig(data_dir=data_dir), readonly=True)
    except lmdb.Error as exc:
        raise DataLoss(f"{data_dir / 'lmdb' / 'data.mdb'} cannot be opened as an LMDB database: {exc}") from None


def _inspect(args: argparse.Namespace) -> int:
    # Read in a child process (sidecar/isolated.py): a damaged page can make LMDB abort().
    info, frames = isolated.call(
        args.data_dir, _open_readonly, partial(_frame_list, session=args.session), f"reading session {args.session!r}"
    )
    print(
        f"session {info.session_id}: versions {info.first_version}..{info.head_version}, "
        f"{info.stored_bytes} bytes stored"
    )
    print(f"{'version':>8} {'kind':<6} {'chain':>5} {'stored':>9} {'state':>10}  created (UTC)")
    depth = 0
    for version, vinfo, frame_bytes, starts_chain in frames:
        # A corrupt frame still holds its place in its chain (by its raw kind byte, as verify reads it).
        depth = 0 if starts_chain else depth + 1
        if isinstance(vinfo, DataLoss):
            print(f"{version:>8} CORRUPT {depth:>4} {frame_bytes:>9}  (run `ckpt verify` for details)")
            continue
        print(
            f"{version:>8} {vinfo.frame_kind.name:<6} {depth:>5} {vinfo.stored_bytes:>9} "
            f"{vinfo.state_size:>10}  {_utc(vinfo.created_unix_nanos)}"
        )
    return 0


def _utc(unix_nanos: int) -> str:
    """RFC 3339 in UTC, as ``history`` prints a version's ``created_at`` (protobuf's JSON form of a Timestamp)."""
    when = Timestamp()
    when.FromNanoseconds(unix_nanos)
    return when.ToJsonString()


def _frame_list(store: Store, session: str) -> tuple[SessionInfo, list[tuple[int, VersionInfo | DataLoss, int, bool]]]:
    """What inspect prints of a session: its record and each version's info, frame size, and whether it is FULL."""
    info, frames = store.frames_of(session)
    return info, [(version, vinfo, len(frame), _starts_chain(frame)) for version, vinfo, frame in frames]


def _starts_chain(frame: bytes) -> bool:
    """Whether a stored frame is FULL, by its kind byte alone (read raw: its header may fail its checks)."""
    return len(frame) > 5 and frame[5] == FrameKind.FULL


def _verify(args: argparse.Namespace) -> int:
    def fail(subject: str, problem: str) -> None:
        print(f"FAIL {subject}: {problem}", file=sys.stderr)

    # The tables are cross-checked in another child, beside the per-session checks (sidecar/crosscheck.py).
    cross = isolated.CrossChecks(args.data_dir, args.sessions, _open_readonly)
    try:
        # Every session is read in a child process (sidecar/isolated.py): a damaged page can make
        # LMDB abort() or crash; that session is then reported and a new child checks the rest.
        counts = isolated.verify(
            args.data_dir,
            args.sessions,
            _open_readonly,
            # A session listed here may be deleted by a running sidecar before it is read:
            # gone is not damaged. A session named on the command line must exist.
            lambda store, session, vanished_ok: verify_session(store, session, vanished_ok=vanished_ok),
            fail,
        )
        checked, failures = counts.checked, counts.failed
        others = 0
        if counts.listing_failures:  # the cross-checks need every record: a sessions table that cannot be listed
            print("ckpt verify: the tables are not cross-checked (listing the sessions failed)", file=sys.stderr)
        else:
            checked, failures, others = _cross_check(cross, counts.failed_sessions, checked, failures, fail)
    finally:
        cross.cancel()
    listing = "; listing the sessions failed (see above)" if counts.listing_failures else ""
    more = f"; {others} more problem{'s' if others > 1 else ''} cross-checking the tables (see above)" if others else ""
    sessions = "session" if checked == 1 else "sessions"
    print(f"verified {checked} {sessions}: {checked - failures} ok, {failures} failed{listing}{more}")
    return 1 if failures or counts.listing_failures or others else 0


def _cross_check(
    cross: isolated.CrossChecks, failed: set[str], checked: int, failures: int, fail: Callable[[str, str], None]
) -> tuple[int, int, int]:
    """Cross-check the tables (sidecar/crosscheck.py); the counts of sessions checked and failed, and of other problems.

    A session whose entries are wrong fails (one with frames but no record
    counts as checked too, as when the sessions are listed from the frames
    table); an entry naming a session that does not exist, or an index table
    that cannot be read, is one of the other problems. The frames and
    sessions tables failing here are not: the per-session checks read them.
    """
    others = 0

    def problem(p: Problem) -> None:
        nonlocal checked, failures, others
        if p.session is None:
            fail(f"{p.table} table", p.text)
            others += 1
            return
        session = isolated.session_id(p.session)
        fail(f"session {session!r}", f"{p.table} table: {p.text}")
        if not p.exists:
            others += 1
        elif session not in failed:
            failed.add(session)
            failures += 1
            checked += p.table == "sessions"  # found by its frames: not listed before

    broken = cross.finish(problem, fail)
    others += sum(table not in ("sessions", "frames") for table in broken)
    return checked, failures, others


def verify_session(store: Store, session: str, *, vanished_ok: bool = False) -> list[str] | None:
    """Every frame's checksum and link, every version's metadata, every version decoded; the problems found.

    None if the session does not exist and ``vanished_ok`` (it was deleted since it was listed).
    """
    try:
        info, frames = store.frames_of(session)
    except NotFound as exc:
        return None if vanished_ok else [str(exc)]
    except (StoreError, lmdb.Error) as exc:  # a damaged record or B-tree page: report it, check the others
        return [str(exc)]
    # Said under the session's name already: its own "session 'x': " prefix goes.
    problems = [
        str(vinfo).removeprefix(f"session {session!r}: ") for _, vinfo, _ in frames if isinstance(vinfo, DataLoss)
    ]
    corrupt = {version for version, vinfo, _ in frames if isinstance(vinfo, DataLoss)}
    chain: list[bytes] = []
    chain_versions: list[int] = []
    expected = info.first_version
    for version, _info, frame in [*frames, (None, None, None)]:
        if version is not None and version != expected:
            problems.append(f"version {expected} is missing (next stored is {version})")
            expected = version
        # The kind byte is read raw: a frame whose header is corrupt still splits chains.
        if version is None or (frame is not None and _starts_chain(frame)):
            if chain:
                decoded = 0
                try:
                    for _ in iter_versions(chain):
                        decoded += 1
                except DecodeError as exc:
                    # The frame after the last one decoded failed; name it if the codec could not.
                    failed = chain_versions[decoded]
                    if failed not in corrupt:  # reported once, above
                        text = str(exc)
                        problems.append(text if f"version {failed}" in text else f"version {failed}: {text}")
            chain, chain_versions = [], []
        if version is None:
            break
        assert frame is not None
        chain.append(frame)
        chain_versions.append(version)
        expected += 1
    if expected - 1 != info.head_version:
        problems.append(f"the head is version {info.head_version} but the last stored frame is {expected - 1}")
    # Where a cold read of the head starts decoding, as the record says: a wrong one fails every read and write.
    starts = [v for v, _i, frame in frames if _starts_chain(frame) and v <= info.head_version]
    if starts and info.chain_start_version != starts[-1]:
        problems.append(
            f"the session record says the head's chain starts at version {info.chain_start_version},"
            f" but its last FULL frame is version {starts[-1]}"
        )
    return problems


# What the data directory holds. The rest of Store.stats() counts what one
# open store did (commits, cache hits): always zero in this read-only opening.
_ON_DISK_STATS = ("sessions", "versions", "map_size_bytes", "used_bytes")


def _stats(args: argparse.Namespace) -> int:
    stats = isolated.call(args.data_dir, _open_readonly, _on_disk_stats, "reading the store's statistics")
    stats["data_mdb_bytes"] = (args.data_dir / "lmdb" / "data.mdb").stat().st_size
    print(json.dumps(stats, indent=1, default=str))
    return 0


def _on_disk_stats(store: Store) -> dict[str, Any]:
    everything = store.stats()
    return {name: everything[name] for name in _ON_DISK_STATS}


def _backup_dest(text: str) -> Path:
    if not text:  # Path("") is ".", which "already exists"
        raise argparse.ArgumentTypeError("DEST is empty; name a new directory")
    return Path(text)


def _sentence(exc: Exception) -> str:
    """An error as the command says it: an OSError without Python's "[Errno 17]" in front."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [repr(name) for name in (exc.filename, exc.filename2) if name is not None]
        return exc.strerror + (": " + " -> ".join(names) if names else "")
    return str(exc)


def _backup(args: argparse.Namespace) -> int:
    started = time.monotonic()
    lmdb_dir = (args.data_dir / "lmdb").resolve()
    if args.dest.parent.resolve().is_relative_to(lmdb_dir):
        raise ValueError(f"DEST {args.dest} is inside LMDB's own directory {lmdb_dir}; put the backup elsewhere")
    # A backup stopped by SIGTERM/SIGHUP (timeout, systemd, a closed terminal) removes its partial copy,
    # as ^C does: the exception unwinds through write_backup's cleanup.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)

    def copy(lmdb_dir: Path) -> tuple[int, int]:
        # In a child process (sidecar/isolated.py): a damaged page can make LMDB abort().
        return isolated.call(
            args.data_dir, _open_readonly, partial(Store.copy_to, lmdb_dir=lmdb_dir), f"copying it into {args.dest}"
        )

    result = write_backup(args.dest, copy)
    summary = {
        "backup": str(result.path),
        "sessions": result.sessions,
        "versions": result.versions,
        "data_mdb_bytes": result.data_mdb_bytes,
        "seconds": round(time.monotonic() - started, 3),
    }
    print(json.dumps(summary))
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _print_json(message: Any) -> None:
    # Text as it is (UTF-8), not \u escapes: session ids and labels are read by people too.
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), sort_keys=True, ensure_ascii=False))


COMMANDS = {
    "serve": _serve,
    "put": _put,
    "get": _get,
    "history": _history,
    "sessions": _sessions,
    "fork": _fork,
    "delete": _delete,
    "inspect": _inspect,
    "verify": _verify,
    "stats": _stats,
    "backup": _backup,
}

if __name__ == "__main__":
    sys.exit(main())
