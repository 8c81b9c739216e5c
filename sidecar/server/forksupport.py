"""gRPC's fork support: off in the sidecar's own processes, unless their environment says otherwise.

With GRPC_ENABLE_FORK_SUPPORT unset, grpcio (1.85) registers pthread_atfork handlers: each fork() of a
process that uses gRPC first runs gRPC's prefork handler, in the forking thread, which holds the GIL. A
fork while gRPC shuts down can wait in that handler for good, every other thread waiting for the GIL.
subprocess.Popen on Linux forks with vfork(), which runs no such handler, unless given a preexec_fn, a
user, group or extra_groups; os.fork and multiprocessing's "fork" method always fork(). The sidecar's
processes fork only to exec at once (its store processes and ``--workers`` workers: storespawn.py,
workers.py) and no child uses its parent's gRPC state: the case gRPC's fork-support notes say to set
GRPC_ENABLE_FORK_SUPPORT=false for, so that no fork of theirs can meet the hang, whichever way it forks.

So ``ckpt serve`` turns it off first thing (serve_command.py), before it imports grpc (which reads the
variable), and every process it starts inherits it (childpython.child_environment copies this process's
environment): workers, and their store processes in turn. A value already in the environment, whatever
it is, is kept. The client never sets it (a library leaves its process's environment alone):
docs/clients.md says when a program using it should. Standard library imports only.
"""

from __future__ import annotations

import os

#: The variable gRPC reads when it is imported (false, 0: no fork handlers; true, 1: fork support).
VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"


def turn_off_grpc_fork_support() -> None:
    """Set GRPC_ENABLE_FORK_SUPPORT=false in this process's environment unless it is set; call it before
    grpc is imported, and before this process starts any other."""
    os.environ.setdefault(VARIABLE, "false")
