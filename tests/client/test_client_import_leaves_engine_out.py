"""A client process imports what a client runs: not the store engine, the server, the tools, the codec's
encoder and decoder, nor LMDB. ``ckpt.sidecar`` still names the store's and the configuration's classes,
imported when first asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt.sidecar
from ckpt.sidecar import config, errors, store
from tests.support import engine_modules, run_fresh


def test_importing_the_clients_loads_no_store_engine_server_tools_codec_or_lmdb() -> None:
    done, modules = run_fresh(
        "import ckpt.sidecar.client\nfrom ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient"
    )
    assert done.returncode == 0, done.stderr.decode()
    assert {"ckpt.sidecar.client.sync_client", "ckpt.sidecar.client.async_client", "grpc"} <= modules
    assert engine_modules(modules) == []


def test_a_client_that_connects_and_reads_still_loads_no_store_engine(tmp_path: Path) -> None:
    # Not a sidecar's reply, only a refused connection: what a client does on its own with one.
    done, modules = run_fresh(
        "from ckpt.sidecar.client import CheckpointClient, UnavailableError\n"
        "with CheckpointClient(sys.argv[1], retries=0) as c:\n"
        "    try:\n"
        "        c.get('agent-7')\n"
        "    except UnavailableError:\n"
        "        print('unavailable')",
        f"unix:{tmp_path / 'none.sock'}",
    )
    assert done.stdout == b"unavailable\n", done.stderr.decode()
    assert engine_modules(modules) == []


def test_the_sidecar_package_imports_the_store_when_one_of_its_names_is_asked_for() -> None:
    done, modules = run_fresh("import ckpt.sidecar\nassert 'NotFound' in vars(ckpt.sidecar)")
    assert done.returncode == 0, done.stderr.decode()
    assert engine_modules(modules) == []
    done, modules = run_fresh("from ckpt.sidecar import Store")
    assert done.returncode == 0, done.stderr.decode()
    assert "ckpt.sidecar.store.engine" in modules


def test_the_sidecar_package_names_the_same_objects_as_their_modules() -> None:
    from ckpt.sidecar import Durability, NotFound, Store, StoreConfig, WriteMode

    assert Store is store.Store and WriteMode is store.WriteMode
    assert StoreConfig is config.StoreConfig and Durability is config.Durability
    assert NotFound is errors.NotFound
    for name in ckpt.sidecar.__all__:
        home = config if name in ("Durability", "Retention", "StoreConfig") else errors
        home = home if hasattr(home, name) else store
        assert getattr(ckpt.sidecar, name) is getattr(home, name), name
    assert set(ckpt.sidecar.__all__) <= set(dir(ckpt.sidecar))


def test_a_name_the_sidecar_package_does_not_have_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"^module 'ckpt\.sidecar' has no attribute 'NoSuchName'$"):
        ckpt.sidecar.NoSuchName  # noqa: B018
