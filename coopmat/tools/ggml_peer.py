"""ggml's Vulkan backend as a benchmark peer: its `test-backend-ops perf -o MUL_MAT`, run as a
subprocess on the same shapes as coopmat's quantized-weight products (`coopmat-bench
--inference --vs-ggml`).

The binary is the prebuilt peer of ../shared/peers/ggml-vulkan (ggml d99724f): found where
that folder's run.sh unpacks it (/tmp/ggml-vulkan), else unpacked there from the tarball
that its stage.sh copies into the checkout's .gpu-deps/ggml-vulkan, or given with --ggml.

A shape in ggml's own perf list (a `test_mul_mat` case, e.g. m=4096, k=14336) is timed as
that case, picked by a regular expression over its parameters, so the figures are the ones
ggml's authors measure. Any other shape becomes a line of a `--test-file` (a generic
MUL_MAT node on the same tensors); ggml then sizes its run count by bytes instead of
FLOPs, which for a shape outside its list is the only way in. Both print one SQL row per
case (`--output sql`), parsed here; ggml's time is its wall time per run over at least a
second of back-to-back runs in one graph.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# ggml's enum values at d99724f (include/ggml.h): what a --test-file line names.
GGML_OP_MUL_MAT = 29
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}
WEIGHTS = ("f16", "q8_0", "q4_0")  # the weight formats both engines take

UNPACKED = Path("/tmp/ggml-vulkan")  # where the peer's run.sh unpacks the tarball
TARBALL = "test-backend-ops-vulkan.tar.xz"
BINARY = Path("bin") / "test-backend-ops"
# Where stage.sh copies the tarball, and the shared folder itself, under a checkout.
_TARBALL_DIRS = (Path(".gpu-deps") / "ggml-vulkan", Path("..") / "shared" / "peers" / "ggml-vulkan")


class PeerError(Exception):
    """ggml's benchmark could not be run or read; the message says why in one line."""


@dataclass(frozen=True)
class MatMulCase:
    """One product both engines time: x (rows x k) @ w.T for a weight w of outputs x k in
    format `weight`. In ggml's terms: m = outputs, n = rows, k = k, type_a = weight,
    type_b = f32 (ggml's activations are float32; coopmat's float16)."""

    weight: str
    rows: int
    outputs: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.outputs * self.k

    @property
    def name(self) -> str:
        """The case's name in a --test-file (no spaces: ggml reads it as one word)."""
        return f"coopmat_{self.weight}_m{self.outputs}_n{self.rows}_k{self.k}"

    def label(self) -> str:
        return f"{self.weight} {self.rows}x{self.k} @ ({self.outputs}x{self.k})^T"


def matmul_cases(weights: Iterable[str], rows: Iterable[int], k: int,
                 outputs: int) -> list[MatMulCase]:
    """The table of products both engines time: every weight format at every row count."""
    weights = list(weights)
    for w in weights:
        if w not in WEIGHTS:
            raise ValueError(f"weight format {w!r}: expected one of {', '.join(WEIGHTS)}")
    return [MatMulCase(w, m, outputs, k) for m in rows for w in weights]


@dataclass(frozen=True)
class PeerResult:
    """ggml's figure for one case: microseconds per run over `runs` runs; `source` says
    whether ggml's own perf case ('builtin') or a --test-file line ('test-file') gave it."""

    case: MatMulCase
    us: float
    runs: int
    source: str

    @property
    def tflops(self) -> float:
        return self.case.flops / (self.us * 1e-6) / 1e12


@dataclass
class PeerRun:
    """What one run of ggml's benchmark gave: its device line, its build, the figures
    found, and the cases it reported unsupported."""

    binary: str
    device: str = ""
    matrix_cores: str = ""
    build_commit: str = ""
    results: dict[MatMulCase, PeerResult] = field(default_factory=dict)
    unsupported: list[MatMulCase] = field(default_factory=list)


def find_binary(explicit: str | None = None, roots: Sequence[Path] = ()) -> Path:
    """test-backend-ops: `explicit` (the binary, its unpacked folder or the tarball), else
    the copy run.sh unpacks at /tmp/ggml-vulkan, else the tarball in one of `roots`' (the
    checkout's) .gpu-deps/ggml-vulkan or ../shared/peers/ggml-vulkan, unpacked there.
    Raises PeerError naming the places it looked."""
    if explicit is not None:
        p = Path(explicit)
        if p.is_file() and p.name.endswith(".tar.xz"):
            return _unpacked(p)
        for cand in (p / BINARY, p):
            if cand.is_file() and os.access(cand, os.X_OK):
                return cand
        raise PeerError(f"--ggml {explicit}: no executable test-backend-ops there "
                        f"(give the binary, its unpacked folder or {TARBALL})")
    if (UNPACKED / BINARY).is_file():
        return UNPACKED / BINARY
    looked = [str(UNPACKED / BINARY)]
    for root in roots:
        for d in _TARBALL_DIRS:
            tar = (root / d / TARBALL).resolve()
            if tar.is_file():
                return _unpacked(tar)
            looked.append(str(tar))
    raise PeerError("ggml's test-backend-ops not found (looked at " + ", ".join(looked)
                    + "): stage it with ../shared/peers/ggml-vulkan/stage.sh or pass "
                    "--ggml PATH")


def _unpacked(tar: Path) -> Path:
    """The tarball unpacked at /tmp/ggml-vulkan as run.sh does (a copy already there is
    kept); through a private folder renamed into place, so a concurrent unpack never
    leaves half a tree."""
    if (UNPACKED / BINARY).is_file():
        return UNPACKED / BINARY
    tmp = Path(tempfile.mkdtemp(prefix="ggml-vulkan-", dir=UNPACKED.parent))
    try:
        with tarfile.open(tar, "r:xz") as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp, filter="data")
            else:  # Python before the extraction filters
                tf.extractall(tmp)
        if not (tmp / BINARY).is_file():
            raise PeerError(f"{tar}: holds no {BINARY}")
        try:
            tmp.rename(UNPACKED)
        except OSError:  # another process unpacked it meanwhile
            if not (UNPACKED / BINARY).is_file():
                raise
    except (OSError, tarfile.TarError) as exc:
        raise PeerError(f"{tar}: cannot unpack into {UNPACKED}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return UNPACKED / BINARY


def environment(binary: Path, device_index: int | None) -> dict[str, str]:
    """The environment run.sh gives the binary (its libraries on LD_LIBRARY_PATH), with
    GGML_VK_VISIBLE_DEVICES naming coopmat's device (ggml skips CPU devices unless told,
    and would take every discrete GPU) unless the caller set it."""
    env = dict(os.environ)
    top = binary.parent.parent if binary.parent.name == "bin" else binary.parent
    libs = [str(top / "src"), str(top / "src" / "ggml-vulkan"), str(binary.parent)]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    if device_index is not None:
        env.setdefault("GGML_VK_VISIBLE_DEVICES", str(device_index))
    return env


def builtin_pattern(cases: Iterable[MatMulCase]) -> str:
    """A regular expression matching exactly the plain test_mul_mat perf cases of `cases`
    (one batch, no broadcast, no permutation, no view, one output)."""
    return "|".join(
        f"^type_a={c.weight},type_b=f32,m={c.outputs},n={c.rows},k={c.k},"
        r"bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1," for c in cases)


def test_file(cases: Iterable[MatMulCase]) -> str:
    """`cases` as test-backend-ops --test-file lines: op, output type and shape, no op
    params, then the two sources (type, shape, zero strides: contiguous) and the name."""
    lines = []
    for c in cases:
        a = f"{GGML_TYPES[c.weight]} {c.k} {c.outputs} 1 1 0 0 0 0"
        b = f"{GGML_TYPES['f32']} {c.k} {c.rows} 1 1 0 0 0 0"
        lines.append(f"{GGML_OP_MUL_MAT} {GGML_TYPES['f32']} {c.outputs} {c.rows} 1 1 0 "
                     f"2 {a} {b} {c.name}")
    return "\n".join(lines) + "\n"


_INSERT = re.compile(r"^INSERT INTO test_backend_ops \(([^)]*)\) VALUES \((.*)\);\s*$")
# ggml's device line: "ggml_vulkan: 0 = NAME (DRIVER) | uma: 0 | ... | matrix cores: KIND".
_DEVICE = re.compile(r"ggml_vulkan: \d+ = (.*) \([^()]*\) \| uma:.*?matrix cores: (\S+)")


def sql_rows(text: str) -> list[dict[str, str]]:
    """The rows of test-backend-ops' `--output sql` in `text` (other lines ignored), each
    as column name -> value."""
    rows = []
    for line in text.splitlines():
        m = _INSERT.match(line)
        if m:
            names = [s.strip() for s in m.group(1).split(",")]
            values = re.findall(r"'([^']*)'", m.group(2))
            if len(values) != len(names):
                raise PeerError(f"unreadable ggml result line: {line[:120]}")
            rows.append(dict(zip(names, values, strict=True)))
    return rows


def op_params(text: str) -> dict[str, str]:
    """A case's 'a=1,b=[1,2],c=x' parameters as a dict (commas in brackets kept)."""
    out, depth, start = {}, 0, 0
    for i, ch in enumerate(text + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            key, _, value = text[start:i].partition("=")
            out[key] = value
            start = i + 1
    return out


def read_output(text: str, cases: Sequence[MatMulCase], source: str, run: PeerRun) -> None:
    """Add to `run` what test-backend-ops' output `text` says of `cases` (those it does
    not mention stay out); `source` is 'builtin' or 'test-file'."""
    m = _DEVICE.search(text)
    if m and not run.device:
        run.device, run.matrix_cores = m.group(1), m.group(2)
    by_name = {c.name: c for c in cases}
    by_shape = {(c.weight, c.outputs, c.rows, c.k): c for c in cases}
    for row in sql_rows(text):
        if row.get("op_name") != "MUL_MAT" or row.get("test_mode") != "perf":
            continue
        p = op_params(row.get("op_params", ""))
        if source == "test-file":
            case = by_name.get(p.get("name", ""))
        else:
            try:
                case = by_shape.get((p["type_a"], int(p["m"]), int(p["n"]), int(p["k"])))
            except (KeyError, ValueError):
                case = None
        if case is None or case in run.results:
            continue
        run.build_commit = run.build_commit or row.get("build_commit", "")
        if row.get("supported") != "1":
            run.unsupported.append(case)
            continue
        us = float(row["time_us"])
        if not us > 0:
            raise PeerError(f"ggml reported {us} us for {case.label()}")
        run.results[case] = PeerResult(case, us, int(row.get("n_runs", "0")), source)


def _run_binary(binary: Path, args: list[str], env: dict[str, str], timeout: float) -> str:
    cmd = [str(binary), "perf", "-o", "MUL_MAT", "-b", "Vulkan0", "--output", "sql", *args]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{binary.name} ran past {timeout:.0f} s") from exc
    except OSError as exc:
        raise PeerError(f"{binary}: cannot run: {exc}") from exc
    text = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        tail = " / ".join(line for line in text.strip().splitlines()[-3:])
        raise PeerError(f"{binary.name} exited with {done.returncode}: {tail}")
    if "ggml_vulkan: No devices found" in text:
        raise PeerError(f"{binary.name}: ggml found no Vulkan device")
    return text


# ggml accumulates its matrix-matrix products in float16 where the device lists float16
# accumulators and the node asks for default precision (ggml_vk_get_mul_mat_mat_pipeline
# at d99724f; the shaders clamp to +-65504), as on the H100/H200. This variable turns its
# float16 support off, so its float16-weight products take the float32-accumulating
# pipelines (quantized cooperative_matrix2 products follow the node's precision alone).
FLOAT32_ACCUMULATION = {"GGML_VK_DISABLE_F16": "1"}


def run(binary: Path, cases: Sequence[MatMulCase], device_index: int | None = None,
        timeout_per_case: float = 60.0, extra_env: dict[str, str] | None = None) -> PeerRun:
    """ggml's time for each case: first its own perf cases of these shapes, then a
    --test-file for those its list lacks; `extra_env` is added to its environment (e.g.
    FLOAT32_ACCUMULATION). Raises PeerError when the binary fails, or when a case is in
    neither's output."""
    env = {**environment(binary, device_index), **(extra_env or {})}
    run_ = PeerRun(str(binary))
    timeout = 30.0 + timeout_per_case * len(cases)
    read_output(_run_binary(binary, ["-p", builtin_pattern(cases)], env, timeout),
                cases, "builtin", run_)
    rest = [c for c in cases if c not in run_.results and c not in run_.unsupported]
    if rest:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="coopmat-ggml-") as f:
            f.write(test_file(rest))
            f.flush()
            read_output(_run_binary(binary, ["--test-file", f.name], env, timeout),
                        rest, "test-file", run_)
    missing = [c.label() for c in cases if c not in run_.results and c not in run_.unsupported]
    if missing:
        raise PeerError("ggml reported nothing for " + "; ".join(missing))
    return run_
