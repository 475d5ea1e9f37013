"""Tuned kernel choices per device, found by `python -m coopmat.bench --tune` and kept on
disk, and the candidates that tuner times. A tuned choice names the kernel family and its
tile for one dtype pair and shape class; where none is recorded, the policy's default tile
is used.

A user's own tuning file wins; otherwise a table shipped in coopmat/policy/tuned/ for the
device (PCI vendor and device id) applies. Whether they are used at all is the policy's
Options.tuning ($COOPMAT_NO_TUNING). Those tables come from `--tune` runs, named by
PCI vendor and device id (docs/design.md, Policy)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from coopmat.codegen import Layout, Tile
from coopmat.codegen.variants import is_cpu
from coopmat.common.cachedir import cache_root
from coopmat.device.model import CooperativeMatrixProperties, PhysicalDeviceInfo
from coopmat.policy.rows_tiles import rows_sweep, rows_traits
from coopmat.policy.tiles import khr_tune_tiles, nv2_tiles
from coopmat.policy.types import TypePair

SHIPPED = Path(__file__).parent / "tuned"
_lock = threading.Lock()
_loaded: dict[str, dict[str, Any]] = {}


def device_key(info: PhysicalDeviceInfo) -> str:
    return f"{info.vendor_id:04x}-{info.device_id:04x}-{info.driver_version}"


def path_for(info: PhysicalDeviceInfo) -> Path | None:
    """The user's tuning file for the device; None when disk caches are off."""
    root = cache_root()
    return root / "tuning" / f"{device_key(info)}.json" if root is not None else None


def _table(info: PhysicalDeviceInfo) -> dict[str, Any]:
    key = device_key(info)
    with _lock:
        if key not in _loaded:
            _loaded[key] = {}
            shipped = SHIPPED / f"{info.vendor_id:04x}-{info.device_id:04x}.json"
            for path in (path_for(info), shipped):
                if path is None:
                    continue
                try:
                    _loaded[key] = json.loads(path.read_text())
                    break
                except (OSError, ValueError):
                    continue
        return _loaded[key]


def choices(info: PhysicalDeviceInfo) -> dict[str, tuple[str, Tile]]:
    """Every recorded (family, tile), by shape-class key ('float16->float32@medium')."""
    return {key: (entry["family"], Tile(*entry["tile"]))
            for key, entry in _table(info).items()
            if isinstance(entry, dict) and "family" in entry and "tile" in entry}


def tuned(info: PhysicalDeviceInfo, key: str) -> tuple[str, Tile] | None:
    """(family, tile) recorded for a shape-class key, if any."""
    return choices(info).get(key)


def record(info: PhysicalDeviceInfo, pair_name: str, family: str, tile: Tile,
           evidence: dict[str, Any]) -> None:
    table = dict(_table(info))
    table[pair_name] = {"family": family, "tile": [tile.tile_m, tile.tile_n, tile.tile_k,
                                                   tile.subgroups_m, tile.subgroups_n,
                                                   tile.buffering], **evidence}
    path = path_for(info)
    if path is not None:  # with disk caches off the choice lasts for this process only
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    with _lock:
        _loaded[device_key(info)] = table


def candidates(info: PhysicalDeviceInfo, pair: TypePair, config: CooperativeMatrixProperties,
               small_m: bool = False) -> list[tuple[str, Tile]]:
    """(family, tile) pairs the tuner times for a dtype pair on a device, the default
    first: khr tiles; nv2 tiles for the general shape classes; for few rows (`small_m`)
    the rows family's sweep instead, on a GPU (too slow to time on a CPU)."""
    cpu = is_cpu(info)
    out: list[tuple[str, Tile]] = [
        ("khr", t) for t in khr_tune_tiles(config, info.limits, small_m, cpu=cpu)]
    if not small_m:
        out += [("nv2", t) for t in nv2_tiles(info, pair.operand, pair.result)]
    elif not cpu:
        base = rows_traits(config, info.limits, Layout.ROW_MAJOR, Layout.ROW_MAJOR, False, 16)
        out += [("rows", t) for t in rows_sweep(base, info.limits.max_compute_shared_memory_size)]
    return out
