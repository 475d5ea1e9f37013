"""scripts/run in the CPU sandbox behaves like running its command here, on the host.

Each test starts scripts/run with COOPMAT_RUN=sandbox (so scripts/cpu-vulkan: a chroot in a
private mount namespace) from the host and checks what the command saw and left behind:
the current directory, /tmp, $HOME, script and output paths outside the checkout, stdin
and the exit status. They must run on the host, as root: .ci/run runs them there with

    python3 tests/unit/test_sandbox_run.py     # no pytest needed; ends with "N passed, M failed"

Under pytest they run likewise on a host with a provisioned sandbox, and skip, with the
reason, inside the sandbox (where scripts/test puts the suite: a sandbox cannot be entered
from inside one) or where no sandbox is provisioned.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import pytest
except ImportError:  # the host's python3, which .ci/run uses, need not have pytest
    pytest = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "scripts" / "run"
HOME = Path(os.path.expanduser("~")).resolve()
# Outside the checkout, $HOME and /tmp: visible inside only through a path argument.
ELSEWHERE = Path("/var/tmp")


def sandbox_root() -> Path:
    """Where scripts/cpu-vulkan keeps its root (its COOPMAT_SANDBOX default)."""
    env = os.environ.get("COOPMAT_SANDBOX")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(HOME / ".cache")
    return Path(cache) / "coopmat" / "trixie-lavapipe"


def inside_sandbox() -> bool:
    return Path("/opt/venv/.coopmat-deps").exists()  # the root's venv stamp


def why_not_here() -> str | None:
    if inside_sandbox():
        return ("runs on the host, not inside the CPU sandbox: .ci/run runs "
                "python3 tests/unit/test_sandbox_run.py there")
    if os.geteuid() != 0:
        return "needs root, as scripts/cpu-vulkan does"
    if not (sandbox_root() / "opt" / "venv" / "bin" / "python").exists():
        return f"no provisioned sandbox at {sandbox_root()} (scripts/cpu-vulkan true makes one)"
    return None


if pytest is not None and __name__ != "__main__":
    _reason = why_not_here()
    if _reason is not None:
        pytest.skip(_reason, allow_module_level=True)

    @pytest.fixture(autouse=True)
    def no_validation_errors() -> Iterator[None]:
        """Overrides conftest's: these tests start no Vulkan instance in this process."""
        yield


def run(*cmd: str, cwd: Path | str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """scripts/run CMD in the sandbox, started from cwd on the host."""
    env = {**os.environ, "COOPMAT_RUN": "sandbox", "CI": "false"}
    return subprocess.run([str(RUN), *cmd], cwd=cwd, input=stdin, capture_output=True,
                          text=True, env=env, timeout=300)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@contextmanager
def host_dir(parent: Path | str) -> Iterator[Path]:
    """A new folder on the host under parent, removed afterwards with the empty mount point
    a run may have left for it in the root."""
    d = Path(tempfile.mkdtemp(prefix="coopmat-sbtest-", dir=parent))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        point = sandbox_root() / str(d).lstrip("/")
        if point.is_dir() and not point.is_symlink():
            try:
                point.rmdir()
            except OSError:
                pass


PROBE = """\
import os, sys
from pathlib import Path
import helper  # a module beside the script
here = Path(__file__)
(here.parent / "beside.txt").write_text("written beside the script")
print(here, os.getcwd(), helper.NAME, sep="\\n")
"""


def write_probe(d: Path) -> Path:
    (d / "helper.py").write_text("NAME = 'helper'\n")
    script = d / "probe.py"
    script.write_text(PROBE)
    return script


def test_tmp_is_the_hosts() -> None:
    name = f"coopmat-sbtest-{uuid.uuid4().hex}"
    host_in, inner_out = Path("/tmp") / f"{name}.in", Path("/tmp") / f"{name}.out"
    host_in.write_text("from the host")
    try:
        # The paths are in the code only, not arguments: /tmp itself is the host's.
        code = (f"print(open('/tmp/{name}.in').read()); "
                f"open('/tmp/{name}.out', 'w').write('from inside')")
        assert ok(run("python3", "-c", code, cwd=ROOT)).strip() == "from the host"
        assert inner_out.read_text() == "from inside"
        assert inner_out.stat().st_uid == os.geteuid()
    finally:
        host_in.unlink(missing_ok=True)
        inner_out.unlink(missing_ok=True)


def test_bench_json_lands_in_host_tmp() -> None:
    """The issue's case: --json /tmp/x.json exited 0 and the file never reached the host."""
    out = Path("/tmp") / f"coopmat-sbtest-{uuid.uuid4().hex}.json"
    try:
        ok(run("python3", "-m", "coopmat.bench", "--dtypes", "float16->float32", "--sizes", "64",
               "--layouts", "nn", "--repeat", "1", "--budget", "0.1", "--no-peers",
               "--json", str(out), cwd=ROOT))
        assert '"results"' in out.read_text()
    finally:
        out.unlink(missing_ok=True)


def test_cwd_is_kept_and_relative_output_lands_there() -> None:
    code = "import os; print(os.getcwd()); open('out.txt', 'w').write('relative')"
    with host_dir(ELSEWHERE) as d:
        assert ok(run("python3", "-c", code, cwd=d)).strip() == str(d)
        assert (d / "out.txt").read_text() == "relative"
    sub = ROOT / "tests"
    assert ok(run("python3", "-c", "import os; print(os.getcwd())", cwd=sub)).strip() == str(sub)


def test_wrapper_from_another_directory() -> None:
    assert ok(run("python", "-c", "import os; print(os.getcwd())", cwd="/tmp")).strip() == "/tmp"


def test_checkout_at_its_host_path_and_importable() -> None:
    code = ("import os, coopmat; print(coopmat.__file__); "
            "print(os.path.exists('/src/pyproject.toml'))")
    lines = ok(run("python3", "-c", code, cwd="/")).split()
    assert Path(lines[0]).resolve() == ROOT / "coopmat" / "__init__.py"
    assert lines[1] == "True"  # /src: the checkout, as before


def check_probe(script: Path, out: str, cwd: Path | str) -> None:
    file, wd, helper = out.split("\n")[:3]
    assert Path(file).resolve() == script.resolve()
    assert Path(wd).resolve() == Path(cwd).resolve()
    assert helper == "helper"
    assert (script.parent / "beside.txt").read_text() == "written beside the script"


def test_script_in_tmp_outside_the_checkout() -> None:
    with host_dir("/tmp") as d:
        script = write_probe(d)
        check_probe(script, ok(run("python3", str(script), cwd=ROOT)), ROOT)


def test_script_in_home_outside_the_checkout() -> None:
    with host_dir(HOME) as d:
        script = write_probe(d)
        check_probe(script, ok(run("python3", str(script), cwd="/")), "/")


def test_script_elsewhere_by_absolute_and_relative_path() -> None:
    with host_dir(ELSEWHERE) as d, host_dir(ELSEWHERE) as cwd:
        script = write_probe(d)
        check_probe(script, ok(run("python3", str(script), cwd=ROOT)), ROOT)
        (d / "beside.txt").unlink()
        rel = os.path.join("..", d.name, "probe.py")  # outside the cwd, given relatively
        check_probe(script, ok(run("python3", rel, cwd=cwd)), cwd)


def test_home_is_the_hosts() -> None:
    with host_dir(HOME) as d:
        # Only the folder's name is an argument: the file goes there through ~ alone.
        code = ("import os, sys; print(os.environ['HOME']); print(os.path.expanduser('~')); "
                "open(os.path.expanduser('~/' + sys.argv[1] + '/f.txt'), 'w').write('home')")
        home, tilde = ok(run("python3", "-c", code, d.name, cwd=ROOT)).split()
        assert home == tilde == os.environ.get("HOME", str(HOME))
        assert (d / "f.txt").read_text() == "home"
        # A working directory inside $HOME: relative output lands there.
        ok(run("python3", "-c", "open('rel.txt', 'w').write('x')", cwd=d))
        assert (d / "rel.txt").read_text() == "x"


def test_exit_status_passes_through() -> None:
    for status in (0, 3, 42):
        proc = run("python3", "-c", f"import sys; sys.exit({status})", cwd=ROOT)
        assert proc.returncode == status, proc.stderr
    assert run("sh", "-c", "exit 1", cwd="/tmp").returncode == 1


def test_stdin_passes_through() -> None:
    proc = run("python3", "-c", "import sys; print(sys.stdin.read().upper(), end='')",
               cwd=ROOT, stdin="line one\nline two\n")
    assert ok(proc) == "LINE ONE\nLINE TWO\n"


def test_path_arguments_are_the_hosts() -> None:
    """A host folder given as an argument is a folder inside (a program can refuse it up
    front), and a file yet to be written, as PATH or --opt=PATH, lands on the host."""
    code = ("import os, sys; print(*[os.path.isdir(a) for a in sys.argv[1:3]]); "
            "open(sys.argv[3], 'w').write('a'); p = sys.argv[4].split('=', 1)[1]; "
            "os.makedirs(os.path.dirname(p)); open(p, 'w').write('b')")
    with host_dir(ELSEWHERE) as d, host_dir("/tmp") as t, host_dir(ELSEWHERE) as e:
        out = ok(run("python3", "-c", code, str(d), str(t), str(d / "a.json"),
                     f"--out={e}/new/deep/b.json", cwd=ROOT))
        assert out.split() == ["True", "True"]
        assert (d / "a.json").read_text() == "a"
        assert (e / "new" / "deep" / "b.json").read_text() == "b"


def test_root_system_folders_stay_the_roots() -> None:
    """A working directory in the root's own system (/usr) is not covered by the host's:
    the root's Mesa stays visible."""
    code = ("import glob, os; print(os.getcwd()); "
            "print(bool(glob.glob('/usr/share/vulkan/icd.d/lvp_icd*')))")
    assert ok(run("python3", "-c", code, cwd="/usr")).split() == ["/usr", "True"]


def test_mounts_vanish_with_the_process() -> None:
    before = Path("/proc/self/mountinfo").read_text()
    inside = ok(run("cat", "/proc/self/mountinfo", cwd=ROOT))
    assert " /tmp " in inside  # bound inside
    after = Path("/proc/self/mountinfo").read_text()
    assert after == before
    assert str(sandbox_root()) not in after


def main() -> int:
    reason = why_not_here()
    if inside_sandbox():
        print(f"tests/test_sandbox_run.py: {reason}", file=sys.stderr)
        return 2
    tests: list[tuple[str, Callable[[], None]]] = [
        (name, fn) for name, fn in globals().items() if name.startswith("test_") and callable(fn)
    ]
    passed = failed = 0
    t0 = time.monotonic()
    for name, fn in tests:
        t = time.monotonic()
        try:
            fn()
        except Exception:
            failed += 1
            print(f"FAILED {name}", flush=True)
            traceback.print_exc()
        else:
            passed += 1
            print(f"passed {name} ({time.monotonic() - t:.1f} s)", flush=True)
    print(f"tests/test_sandbox_run.py: {passed} passed, {failed} failed "
          f"in {time.monotonic() - t0:.1f} s")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
