"""The `ckpt` command line.

    ckpt serve [--data-dir DIR] [--listen ADDR ...]      run the sidecar
    ckpt put SESSION [FILE] [--merge] [--type NAME]      write a version (FILE or stdin)
    ckpt get SESSION [--version N] [--out FILE]          read a version (to stdout or FILE)
    ckpt history SESSION                                 list versions, newest first
    ckpt sessions [--label K=V] [--prefix P]             list sessions (filters: labels, update time, id prefix)
    ckpt fork SESSION NEW_SESSION [--version N]          fork a session
    ckpt delete SESSION                                  delete a session
    ckpt events SESSION [--type T] [--since T] [--follow] a session's events, oldest first
    ckpt register-type FILE                              register the message types of a FileDescriptorSet
    ckpt blob put SESSION FILE [--media-type T]          store a blob (an artifact) by reference; print its ref
    ckpt blob get REF [--out FILE] [--offset N]          read a blob (to stdout or FILE), or a range of it
    ckpt inspect SESSION [--data-dir DIR]                frames of a session: kinds, sizes, chains
    ckpt verify [SESSION ...] [--data-dir DIR]           check every frame, chain and index entry; exit 1 on failure
    ckpt stats [--data-dir DIR]                          store statistics as JSON
    ckpt backup DEST [--data-dir DIR]                    consistent copy of the data directory into DEST
    ckpt compact [--data-dir DIR]                        rewrite data.mdb in full pages (sidecar stopped)
    ckpt bench run|report|scale|langgraph                the benchmarks (docs/performance.md; the bench extra)

put/get/history/sessions/fork/delete/events/register-type/blob talk to a running sidecar (--target, default the
unix socket in --data-dir); inspect/verify/stats/backup read a data directory
directly (read-only, safe beside a running sidecar); compact rewrites one whose
sidecar is stopped. Every `serve` option,
--data-dir and --target have an environment variable (shown in --help).
Errors go to stderr: exit status 1 when the command fails, 2 for a bad
command line or configuration.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Declared, Option, ServeConfig, declared
from ..limits import DEFAULT_MAX_MESSAGE_BYTES

#: `ckpt serve`'s options: ServeConfig's fields and its store's (config/option.py).
SERVE_OPTIONS = declared(ServeConfig)
_DATA_DIR = next(d for d in SERVE_OPTIONS if d.name == "data_dir")
#: The options of the commands that talk to a sidecar (besides --data-dir).
CLIENT_OPTIONS = [
    Declared(
        ("target",),
        Option(help="sidecar address, unix:/path or host:port", shown="the socket in --data-dir"),
        None,
    ),
    Declared(
        ("max_message_bytes",),
        Option(
            help="largest message this command sends or takes; raise it with the sidecar's --max-message-bytes"
            " (the same variable) for larger states",
            parse=int,
        ),
        DEFAULT_MAX_MESSAGE_BYTES,
    ),
    *(
        Declared((name,), Option(help=help_text, metavar=metavar), None)
        for name, metavar, help_text in (
            ("tls_ca_file", "FILE", "connect with TLS to a host:port --target, trusting this PEM CA"),
            ("tls_client_cert_file", "FILE", "this client's PEM certificate, for a sidecar that requires one"),
            ("tls_client_key_file", "FILE", "the private key of --tls-client-cert-file (PEM)"),
            ("tls_server_name", "NAME", "check the sidecar's certificate against this name, not --target's host"),
        )
    ),
]


def _env_text(opt: Declared) -> str | None:
    """The option's environment variable, if set to something."""
    return os.environ.get(opt.env) or None


#: A number as an option or variable takes it: ASCII digits, a sign, a point, an exponent; "inf" and "nan"
#: (which the options' checks refuse by name).
_PLAIN_NUMBER = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|-?inf|nan", re.IGNORECASE | re.ASCII)


def _reader(opt: Declared) -> Callable[[str], Any]:
    """The option's argparse ``type``: its text read as the declaration says, or an error naming its variable.

    argparse converts a text default with the ``type`` only when the option
    is used, so a bad variable is reported like a bad option, and only by
    the command that reads it. It checks ``choices`` against what is typed,
    not against a default taken from the environment: this does.
    """
    how = opt.option

    def read(text: str) -> Any:
        if how.choices and text not in how.choices:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(how.choices)} (from the option or {opt.env})"
            )
        try:
            if how.parse in (int, float) and not _PLAIN_NUMBER.fullmatch(text):
                raise ValueError(text)  # int() and float() take "1_0", " 10", "+10" and other scripts' digits
            return how.parse(text)
        except ValueError:
            what = "an integer" if how.parse is int else "a number" if how.parse is float else how.parse.__name__
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (from the option or {opt.env})") from None

    return read


def add_option(parser: argparse.ArgumentParser, opt: Declared) -> None:
    """``opt``'s flag, also set by its CKPT_* variable; the help ends naming the variable and the default."""
    how = opt.option
    where = opt.env + (", comma-separated" if how.repeated else "")
    where += f"; default {opt.shown}" if opt.shown is not None else ""
    more: dict[str, Any] = {"choices": how.choices} if how.choices else {}
    if how.repeated:  # the variable is read after parsing: argparse would append the flags to it (serve_options)
        more.update(append=True, default=None)
    else:
        more.update(type=_reader(opt), default=_env_text(opt) or opt.default)
    parser.add_argument(opt.flag, action=_Given, metavar=how.metavar, help=f"{how.help} (env {where})", **more)


#: The attribute of a parsed command line holding the options it gave: the others' values are their variables'
#: (where set) or their defaults.
_GIVEN = "options_given"


class _Given(argparse.Action):
    """argparse's ``store`` (``append``, with ``append=True``), noting in the namespace that the option was given."""

    def __init__(self, *args: Any, append: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.append = append

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *_: Any) -> None:
        if self.append:
            values = [*(getattr(namespace, self.dest) or []), values]
        setattr(namespace, self.dest, values)
        setattr(namespace, _GIVEN, {*getattr(namespace, _GIVEN, ()), self.dest})


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """`ckpt serve`'s option values by field name (ServeConfig.from_options); a repeated option's
    variable, comma-separated, where its flag was not given."""
    values = {d.name: getattr(args, d.name) for d in SERVE_OPTIONS}
    for d in SERVE_OPTIONS:
        if d.option.repeated and not values[d.name]:
            values[d.name] = [text for text in (_env_text(d) or "").split(",") if text.strip()]
    return values


#: The options with a variable, by field name.
_DECLARED = {d.name: d for d in (*SERVE_OPTIONS, *CLIENT_OPTIONS)}


#: A value a message quotes, as repr() does ('...' or "..."); a quote after a letter is an apostrophe.
_QUOTED = re.compile(r"""(?<!\w)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def in_option_terms(message: str, args: argparse.Namespace) -> str:
    """A configuration error with its field names spelled as the options that set them; a value that came
    from the option's variable is named by it too: ``--threads (from CKPT_THREADS) must be >= 1, got 0``."""
    given: set[str] = getattr(args, _GIVEN, set())
    parts = _QUOTED.split(message)  # the values quoted (odd items) are left as given: a path may hold "target"
    for name in vars(args):
        if name in ("command", _GIVEN):
            continue
        term = "--" + name.replace("_", "-")
        opt = _DECLARED.get(name)
        if opt is not None and name not in given and _env_text(opt) is not None:
            term += f" (from {opt.env})"
        parts[::2] = [re.sub(rf"\b{name}\b", term, part) for part in parts[::2]]
    # An option left out is the config's None.
    return "".join(parts).replace(" or None, got", " (or left out), got")


#: What `pip install` calls the project ("ckpt" on PyPI is another's).
_DISTRIBUTION = "ckpt-sidecar"


def _version() -> str:
    import importlib.metadata  # ~15 ms: only for --version, not for every command

    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


class _VersionAction(argparse.Action):
    """argparse's ``action="version"``, the version looked up only when it is asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"ckpt {_version()}")
        parser.exit()


#: The longest `ckpt events --follow` poll interval: a day (time.sleep takes no more than ~292 years).
MAX_POLL_SECONDS = 86400.0


def _poll_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < seconds <= MAX_POLL_SECONDS:  # nan too
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {MAX_POLL_SECONDS:g} (a day), got {text!r}")
    return seconds


def _backup_dest(text: str) -> Path:
    if not text:  # Path("") is ".", which "already exists"
        raise argparse.ArgumentTypeError("DEST is empty; name a new directory")
    return Path(text)


#: Each command's one line in the overview, and its description.
_COMMANDS = {
    "serve": ("run the sidecar", "Run the gRPC sidecar until SIGTERM/SIGINT."),
    "put": ("write a version", "Write a version from FILE or stdin."),
    "get": ("read a version", "Write a version's state bytes to stdout or FILE."),
    "history": ("list versions", "List a session's versions, newest first."),
    "sessions": (
        "list sessions",
        "List sessions (one JSON object a line); with filters, the sessions carrying every --label, last written"
        " in [--updated-after, --updated-before) and whose id starts with --prefix. In session id order, except"
        " with time filters and no --label: in order of last write (to about a second, then by id).",
    ),
    "fork": ("fork a session", "Create NEW_SESSION from a version of SESSION."),
    "delete": ("delete a session", "Delete a session and all its versions."),
    "events": (
        "list a session's events",
        "List a session's events (one JSON object a line, oldest first): of any --type given, after --since. With"
        " --follow, keep polling for new ones until interrupted.",
    ),
    "register-type": (
        "register message types",
        "Register the message types a FileDescriptorSet defines (FILE, as `protoc --include_imports"
        " --descriptor_set_out=FILE` or `buf build -o FILE` write it), so that puts can name them (put --type);"
        " print their names as JSON.",
    ),
    "blob": (
        "store or read a blob",
        "blob put SESSION FILE: store FILE (- for stdin) as a blob referenced by SESSION, once however many sessions"
        " store the same bytes, and print its ArtifactRef as JSON (its uri, ckpt-blob:sha256:<hex>, is what a"
        " checkpoint names it by). blob get REF: write the blob REF names (an uri, sha256:<hex> or the hex) to"
        " stdout or --out FILE, or --length bytes of it from --offset.",
    ),
    "inspect": (
        "show a session's frames",
        "Show a session's versions: frame kinds, sizes and chain positions (offline).",
    ),
    "verify": (
        "check every frame",
        "Check every frame's checksum and chain links, then cross-check the session records against the frames"
        " table and the index tables (update time, labels, request ids and their expiry); offline. With SESSIONs,"
        " only those sessions and the index entries naming them. Exit 1 on any failure.",
    ),
    "stats": ("store statistics", "Print store statistics as JSON (offline)."),
    "backup": (
        "back up the data directory",
        "Copy the data directory into DEST, a new directory, as of one snapshot: every write acknowledged before the"
        " backup began, none half-made; free pages are left out. Safe beside a running sidecar. DEST is a data"
        " directory itself: `ckpt serve --data-dir DEST` serves it, `ckpt verify --data-dir DEST` checks it. Prints"
        " what it holds as JSON.",
    ),
    "compact": (
        "rewrite data.mdb in full pages, without free pages",
        "Write the data directory's data.mdb again, each table in key order in full pages and free pages left"
        " out, and put it in place of the old one, which a crash at any point leaves whole. The"
        " store must not be open anywhere: stop the sidecar first. Prints what the store holds and data.mdb's"
        " size before and after as JSON.",
    ),
}
_TALK_TO_A_SIDECAR = ("put", "get", "history", "sessions", "fork", "delete", "register-type", "events", "blob")


def _commands(sub: Any) -> None:
    """Every command's parser, on ``sub`` (the top parser's subparsers)."""
    p = {name: sub.add_parser(name, help=line, description=text) for name, (line, text) in _COMMANDS.items()}
    for serve_option in SERVE_OPTIONS:
        add_option(p["serve"], serve_option)
    for name in p.keys() - {"serve"}:
        add_option(p[name], _DATA_DIR)
    for name in _TALK_TO_A_SIDECAR:
        for client_option in CLIENT_OPTIONS:
            add_option(p[name], client_option)
        if name not in ("sessions", "register-type", "blob"):
            p[name].add_argument("session")

    p["put"].add_argument("file", nargs="?", default="-", help="state bytes (default: stdin)")
    p["put"].add_argument(
        "--merge", action="store_true", help="MERGE: the input is a patch merged onto the latest state"
    )
    p["put"].add_argument("--expected-version", type=int, default=None, help="compare-and-set on the head")
    p["put"].add_argument("--request-id", default=None, help="idempotency key (default: generated)")
    p["put"].add_argument(
        "--type",
        default=None,
        metavar="NAME",
        dest="message_type",
        help="the registered message type the input holds (e.g. acme.agent.v1.State): it is checked against it",
    )
    p["register-type"].add_argument("file", type=Path, help="a serialized google.protobuf.FileDescriptorSet")
    for name in ("put", "sessions"):
        p[name].add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    p["get"].add_argument("--version", type=int, default=0, help="version (default: latest)")
    p["get"].add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    for bound in ("--updated-after", "--updated-before"):
        p["sessions"].add_argument(bound, default=None, metavar="TIME", help="ISO 8601 with a UTC offset or Z")
    p["sessions"].add_argument(
        "--prefix", default="", metavar="P", help="only sessions whose id starts with P (alone: reads only those)"
    )
    p["blob"].add_argument("action", choices=("put", "get"), help="put: store FILE; get: read REF")
    p["blob"].add_argument("subject", metavar="SESSION|REF", help="put: the session; get: the blob's ref")
    p["blob"].add_argument("file", nargs="?", default=None, metavar="FILE", help="put: the blob (- for stdin)")
    p["blob"].add_argument("--media-type", default="", metavar="T", help="put: its media type, e.g. image/png")
    p["blob"].add_argument("--out", "-o", type=Path, default=None, metavar="FILE", help="get: write here, not stdout")
    p["blob"].add_argument("--offset", type=int, default=None, metavar="N", help="get: from byte N")
    p["blob"].add_argument("--length", type=int, default=None, metavar="N", help="get: N bytes at most")
    p["fork"].add_argument("new_session")
    p["fork"].add_argument("--version", type=int, default=0, help="version to fork (default: latest)")
    p["fork"].add_argument("--copy-events", action="store_true", help="copy the session's event log too")
    p["events"].add_argument("--type", action="append", default=[], metavar="T", help="only this type (repeatable)")
    p["events"].add_argument("--since", default=None, metavar="TIME", help="only events after this (ISO 8601, Z)")
    p["events"].add_argument("--follow", action="store_true", help="keep polling for new events until interrupted")
    p["events"].add_argument(
        "--poll-seconds",
        type=_poll_seconds,
        default=1.0,
        help=f"--follow's poll interval, > 0 and at most {MAX_POLL_SECONDS:g} (default 1)",
    )
    p["inspect"].add_argument("session")
    p["verify"].add_argument("sessions", nargs="*", help="sessions to check (default: all)")
    p["backup"].add_argument("dest", type=_backup_dest, help="the backup's directory (must not exist; its parent must)")
    # `ckpt bench ...` is handed whole to the harness (bench/harness/main.py) by the `ckpt` command
    # (ckpt/command.py) before any parsing; listed here for the overview only.
    sub.add_parser("bench", help="benchmark harness: ckpt against other stores (ckpt bench --help)", add_help=False)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with a command's options also after its positional arguments.

    argparse alone settles an optional positional at the first run of
    positionals, so ``ckpt put s --merge patch.bin`` used to fail with
    "unrecognized arguments: patch.bin" (and ``ckpt verify s1 --data-dir d s2``
    likewise). The command's own parser reads its arguments intermixed; its
    errors name the command (``ckpt put: error: ...``). After ``--`` every
    argument is positional (``ckpt get -- -odd-id``), which the intermixed
    reading does not support (Python 3.11), so such a command line is read
    the plain way.
    """
    parser = argparse.ArgumentParser(
        prog="ckpt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _commands(sub)
    commands: dict[str, argparse.ArgumentParser] = sub.choices
    if argv and argv[0] in commands:
        command, namespace = commands[argv[0]], argparse.Namespace(command=argv[0])
        if "--" in argv:
            return command.parse_args(argv[1:], namespace=namespace)
        return command.parse_intermixed_args(argv[1:], namespace=namespace)
    return parser.parse_args(argv)  # no command, an unknown one, or -h: the overview's usage and errors
