"""StoreConfig and Retention refuse, naming the field and its limit, every value the store could not run with:
a float or bool where an int goes, an int past what LMDB (or the machine) takes, NaN or an infinite duration."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar import Retention, Store, StoreConfig

INT_FIELDS = (
    "map_size_bytes",
    "max_map_size_bytes",
    "cache_size_bytes",
    "encoder_cache_entries",
    "encoder_cache_bytes",
    "max_state_bytes",
    "max_blob_bytes",
    "max_batch_writes",
    "max_queued_write_bytes",
    "max_readers",
)
DURATIONS = (
    "request_id_ttl_seconds",
    "sweep_interval_seconds",
    "max_commit_delay_seconds",
    "keyframe_after_quiet_seconds",
)


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", [3.5 * 2**20, float("nan"), True, "5"], ids=["float", "nan", "bool", "str"])
def test_an_integer_setting_of_another_type_is_refused_by_name(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"^{name} must be an int, not {type(value).__name__}$"):
        StoreConfig(data_dir=tmp_path, **dict[str, Any]({name: value}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_readers": 2**31}, rf"max_readers must be at most {2**31 - 1}, got {2**31}"),
        ({"max_readers": 2**32}, rf"max_readers must be at most {2**31 - 1}, got {2**32}"),
        ({"map_size_bytes": 2**64, "max_map_size_bytes": 2**64}, rf"map_size_bytes must be at most {sys.maxsize}"),
        ({"max_map_size_bytes": 2**63}, rf"max_map_size_bytes must be at most {sys.maxsize}, got {2**63}"),
        ({"cache_size_bytes": 2**63}, rf"cache_size_bytes must be at most {sys.maxsize}"),
        ({"max_blob_bytes": 2**70}, rf"max_blob_bytes must be at most {sys.maxsize}"),
        ({"max_queued_write_bytes": 2**63}, rf"max_queued_write_bytes must be at most {sys.maxsize}"),
        ({"max_state_bytes": 2**32}, rf"max_state_bytes must be in 1\.\.{2**32 - 1}, got {2**32}"),
    ],
)
def test_an_integer_setting_past_what_the_backend_takes_is_refused_with_its_limit(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StoreConfig(data_dir=tmp_path, **kwargs)


def test_the_largest_integer_settings_open_a_store(tmp_path: Path) -> None:
    # At the limits (LMDB's reader table is sparse; the map cap is only a cap), the store opens and writes.
    config = StoreConfig(data_dir=tmp_path / "data", max_readers=2**31 - 1, max_map_size_bytes=sys.maxsize)
    with Store(config) as store:
        assert store.put("s", b"\x0a\x01x").version == 1


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_duration_that_is_not_finite_is_refused_by_name(tmp_path: Path, name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number of seconds, got {value}$"):
        StoreConfig(data_dir=tmp_path, **dict[str, Any]({name: value}))


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_of_another_type_is_refused_by_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(TypeError, match=rf"^{name} must be a number of seconds \(int or float\), not str$"):
        StoreConfig(data_dir=tmp_path, **dict[str, Any]({name: "60"}))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"keep_last_versions": 1.5}, TypeError, r"^keep_last_versions must be an int, not float$"),
        ({"keep_last_versions": True}, TypeError, r"^keep_last_versions must be an int, not bool$"),
        ({"keep_last_versions": 2**63}, ValueError, rf"^keep_last_versions must be at most {sys.maxsize}"),
        ({"keep_last_events": 2.0}, TypeError, r"^keep_last_events must be an int, not float$"),
        ({"max_version_age_seconds": float("nan")}, ValueError, r"^max_version_age_seconds must be a finite"),
        ({"max_event_age_seconds": float("inf")}, ValueError, r"^max_event_age_seconds must be a finite"),
        ({"max_event_age_seconds": 4e9}, ValueError, r"^max_event_age_seconds must be at most 3153600000 seconds"),
    ],
)
def test_a_retention_setting_out_of_bounds_is_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Retention(**kwargs)


def test_settings_within_bounds_are_taken(tmp_path: Path) -> None:
    config = StoreConfig(
        data_dir=tmp_path,
        request_id_ttl_seconds=60,
        sweep_interval_seconds=0.5,
        max_commit_delay_seconds=0,
        retention=Retention(keep_last_versions=3, max_version_age_seconds=3600, max_event_age_seconds=0),
    )
    assert config.sweep_interval_seconds == 0.5 and config.retention.keep_last_versions == 3
