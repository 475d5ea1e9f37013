from __future__ import annotations

import atexit
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
CACHE_ENV = "COOPMAT_CACHE_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """One coopmat cache directory for the session (SPIR-V, pipelines, tuning), unless
    COOPMAT_CACHE_DIR is set: each kernel is then built once per session, and no test
    reads the user's ~/.cache/coopmat, whose tuning file would change the policy's choices
    and whose SPIR-V would hide a change to the generator's inputs outside codegen/.
    Child processes the tests start inherit it, and so do pytest-xdist's workers (this runs
    in the controlling process first): the workers share one cache."""
    if os.environ.get(CACHE_ENV) is not None:
        return
    root = tempfile.mkdtemp(prefix="coopmat-tests-")
    os.environ[CACHE_ENV] = root
    # Registered before any pipeline cache's save, so it runs after them at exit.
    atexit.register(shutil.rmtree, root, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's --dist loadgroup (scripts/test) tests go to the workers one by
    one, except that the tests of a module using one of its module- or class-scope
    fixtures with a teardown (a Dask cluster, a server, a child process) stay on one
    worker, so that fixture starts once, as in one process."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name in item.fixturenames if info is not None else ():
            defs = info.name2fixturedefs.get(name)
            if defs and defs[-1].scope in ("module", "class", "package") \
                    and inspect.isgeneratorfunction(defs[-1].func):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
                break


def load_record(name: str) -> dict[str, Any]:
    """A recorded device from tests/data (copied from ../shared/device-data)."""
    return json.loads((DATA / name).read_text())[0]


@pytest.fixture(scope="session")
def live_device_info():
    """The selected Vulkan device with VK_KHR_cooperative_matrix; skips where there is none."""
    from coopmat import device
    from coopmat.common.errors import CoopmatError

    try:
        return device.select_info()
    except CoopmatError as exc:
        pytest.skip(f"no cooperative-matrix Vulkan device: {exc} (run through scripts/test)")


@pytest.fixture(scope="module")
def rt():
    """The selected device's coopmat runtime; skips where there is no cooperative-matrix
    device."""
    from coopmat.common.errors import CoopmatError
    from coopmat.dispatch.runtime import runtime

    try:
        return runtime()
    except CoopmatError as exc:
        pytest.skip(f"no cooperative-matrix device: {exc}")


@pytest.fixture
def private_spirv_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SPIR-V built into this test's own cache directory (its spirv/), from an empty
    memory cache: what a test builds is built by it (for tests of the cache itself; the
    others share the session's). The memory cache is emptied again afterwards, so a
    doctored entry never reaches another test."""
    from coopmat.codegen import cache

    monkeypatch.setenv("COOPMAT_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    yield
    cache.clear_memory_cache()


def is_lavapipe(info) -> bool:
    return info.driver_name == "llvmpipe" or "llvmpipe" in info.name


@pytest.fixture(autouse=True)
def process_options() -> Iterator[None]:
    """What a test changes with coopmat.set_options ends with the test."""
    options = sys.modules.get("coopmat.policy.options")
    before = options._process if options is not None else None
    yield
    options = sys.modules.get("coopmat.policy.options")
    if options is not None:
        options._process = before


@pytest.fixture(autouse=True)
def no_validation_errors():
    """With COOPMAT_VALIDATION=1 every test also fails on a Khronos validation error."""
    from coopmat.device import instance

    before = len(instance.validation_errors)
    yield
    new = instance.validation_errors[before:]
    assert not new, "Vulkan validation errors:\n" + "\n".join(new)
