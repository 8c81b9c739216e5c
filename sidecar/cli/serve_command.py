"""`ckpt serve`: the sidecar's configuration from its options (flags, else CKPT_* variables), then serve."""

from __future__ import annotations

import argparse
import logging
import sys

from ..config import ServeConfig
from ..server.extension import current_extension
from ..server.forksupport import turn_off_grpc_fork_support
from ..server.stopsignals import record_early_stops
from ..server.storespawn import start_serving_store
from .parser import in_option_terms, serve_options


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The configuration `ckpt serve`'s parsed command line (``args``) gives, its errors in the options' terms."""
    try:
        return ServeConfig.from_options(serve_options(args))
    except ValueError as exc:
        raise ValueError(in_option_terms(str(exc), args)) from None


def serve_command(args: argparse.Namespace) -> int:
    # First: a stop signal while the imports below run (~0.4 s) stops the sidecar once it serves, in
    # order, rather than killing it with its store process half started (stopsignals.py). The entry
    # modules have done so before the CLI's imports; this is for callers of cli.main.main (an application).
    record_early_stops()
    # Before grpc is imported (below, or in a worker) and before any process is started, which inherit it:
    # gRPC's fork handlers off unless the environment says otherwise (forksupport.py).
    turn_off_grpc_fork_support()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    config = serve_config(args)
    extension = current_extension()
    # The store process first, once the configuration is known to be good: it imports the store engine
    # while this process imports grpc and the server below (storespawn.py).
    started = start_serving_store(config, extension)
    try:
        from ..server.launch import serve

        return serve(config, extension=extension, started=started)
    finally:
        if started is not None:
            started.discard()
