"""Every `ckpt serve` option is declared once, on the configuration field it sets (ServeConfig, its StoreConfig,
their Retention): its flag and its CKPT_* variable both reach that field, and --help lists both. A field that
is no option is one the sidecar sets itself, or one the command line does not offer."""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import trustme

from ckpt.sidecar.cli.parser import SERVE_OPTIONS, parse_args
from ckpt.sidecar.cli.serve_command import serve_config
from ckpt.sidecar.config import (
    DEFAULT_MAP_SIZE_BYTES,
    MESSAGE_ENVELOPE_BYTES,
    Durability,
    Retention,
    ServeConfig,
    StoreConfig,
)

LISTEN = ("127.0.0.1:50051", "[::1]:50052")


def _samples(tmp_path: Path) -> dict[str, tuple[str, Any]]:
    """Each option's flag: a text for it, other than its default, and the value its field should hold then."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    files = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca")}
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    return {
        "--data-dir": (str(tmp_path / "elsewhere"), tmp_path / "elsewhere"),
        "--listen": (", ".join(LISTEN), LISTEN),
        "--tls-cert-file": (str(files["cert"]), files["cert"]),
        "--tls-key-file": (str(files["key"]), files["key"]),
        "--tls-client-ca-file": (str(files["ca"]), files["ca"]),
        "--metrics-port": ("9464", 9464),
        "--metrics-address": ("0.0.0.0", "0.0.0.0"),
        "--max-message-bytes": (str(32 << 20), 32 << 20),
        "--reply-cache-bytes": (str(8 << 20), 8 << 20),
        "--threads": ("3", 3),
        "--workers": ("2", 2),
        "--event-loop": ("asyncio", "asyncio"),
        "--grace-seconds": ("2.5", 2.5),
        "--heap-trim-interval-seconds": ("0", 0.0),
        "--max-map-size-bytes": (str(64 << 20), 64 << 20),
        "--durability": ("no-meta-sync", Durability.NO_META_SYNC),
        "--cache-size-bytes": (str(1 << 20), 1 << 20),
        "--encoder-cache-bytes": (str(2 << 20), 2 << 20),
        "--keep-last-versions": ("5", 5),
        "--max-version-age-seconds": ("3600", 3600.0),
        "--keep-last-events": ("1000", 1000),
        "--max-event-age-seconds": ("86400", 86400.0),
        "--keyframe-after-quiet-seconds": ("30", 30.0),
        "--fold-after-quiet-seconds": ("90", 90.0),
        "--fold-on-close-seconds": ("2", 2.0),
        "--request-id-ttl-seconds": ("600", 600.0),
        "--sweep-interval-seconds": ("5", 5.0),
        "--max-commit-delay-seconds": ("0", 0.0),
        "--max-blob-bytes": (str(5 << 20), 5 << 20),
        "--max-queued-write-bytes": (str(4 << 20), 4 << 20),
        "--merge-message-type": ("ckpt.v1.Checkpoint", "ckpt.v1.Checkpoint"),
    }


def _variable(flag: str) -> str:
    return "CKPT_" + flag.removeprefix("--").replace("-", "_").upper()


def _value_at(config: ServeConfig, path: tuple[str, ...]) -> Any:
    return functools.reduce(getattr, path, config)


@pytest.mark.parametrize("way", ["flags", "variables"])
def test_each_option_sets_its_field_by_its_flag_or_its_variable(
    way: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = _samples(tmp_path)
    assert sorted(d.flag for d in SERVE_OPTIONS) == sorted(samples)  # the options, no more and no fewer
    for flag in samples:
        monkeypatch.delenv(_variable(flag), raising=False)
    argv = ["serve"]
    for flag, (text, _) in samples.items():
        if way == "variables":
            monkeypatch.setenv(_variable(flag), text)
        elif flag == "--listen":  # given once for each address
            argv += [arg for address in LISTEN for arg in (flag, address)]
        else:
            argv += [flag, text]
    config = serve_config(parse_args(argv))

    untouched = ServeConfig(data_dir=tmp_path)
    for declared in SERVE_OPTIONS:
        _, expected = samples[declared.flag]
        assert _value_at(config, declared.path) == expected, declared.flag
        assert _value_at(untouched, declared.path) != expected, f"{declared.flag}'s sample is its default"
    # What the sidecar sets in its store itself, from its own options.
    assert config.store.data_dir == tmp_path / "elsewhere"
    assert config.store.max_state_bytes == (32 << 20) - MESSAGE_ENVELOPE_BYTES
    assert config.store.map_size_bytes == min(DEFAULT_MAP_SIZE_BYTES, 64 << 20)  # a cap below it shrinks it


def test_a_field_that_is_no_option_is_set_by_the_sidecar_or_not_offered() -> None:
    config_at = {(): ServeConfig, ("store",): StoreConfig, ("store", "retention"): Retention}
    every = {(*within, f.name) for within, config in config_at.items() for f in fields(config)} - set(config_at)
    assert every - {d.path for d in SERVE_OPTIONS} == {
        # Set by ServeConfig from --data-dir, --max-message-bytes and --max-map-size-bytes (checked above).
        ("store", "data_dir"),
        ("store", "max_state_bytes"),
        ("store", "map_size_bytes"),
        # The store's own, not offered by `ckpt serve`.
        ("store", "encoder_cache_entries"),
        ("store", "chain_policy"),
        ("store", "max_batch_writes"),
        ("store", "max_readers"),
    }


def test_serve_help_lists_every_option_and_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["serve", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for declared in SERVE_OPTIONS:
        assert f"\n  {declared.flag} " in text, declared.flag
        assert _variable(declared.flag) in text, declared.flag
