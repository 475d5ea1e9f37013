"""coopmat/tools/ggml_peer.py without a device: reading test-backend-ops' output (samples
recorded from the real binary, ggml d99724f, on lavapipe: tests/data/ggml_perf_*), the
--test-file lines it reads, finding and unpacking the binary, and a run through a stand-in
binary that prints a recorded sample."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from coopmat.tools import ggml_peer
from coopmat.tools.ggml_peer import MatMulCase, PeerError, PeerRun

DATA = Path(__file__).resolve().parents[1] / "data"
BUILTIN = DATA / "ggml_perf_builtin_lavapipe.txt"  # -p over ggml's own perf list
FILE = DATA / "ggml_perf_test_file_lavapipe.txt"  # --test-file of test_file(FILE_CASES)
FILE_CASES = ggml_peer.matmul_cases(["q4_0", "f16", "q8_0"], [1, 3], 64, 48)


def test_builtin_case_read_with_ggml_figures():
    """ggml's own q4_0 m=4096 n=1 k=4096 case: its time and run count as printed, and the
    FLOP rate from the case's 2*m*n*k equal to the one ggml printed beside it."""
    case = MatMulCase("q4_0", 1, 4096, 4096)
    other = MatMulCase("q4_0", 2, 4096, 4096)
    run = PeerRun("x")
    ggml_peer.read_output(BUILTIN.read_text(), [case, other], "builtin", run)
    got = run.results[case]
    assert (got.us, got.runs, got.source) == (57519.324052, 2981, "builtin")
    assert got.tflops * 1e12 == pytest.approx(583359289.296793, rel=1e-6)
    assert other not in run.results and not run.unsupported
    assert run.device == "llvmpipe (LLVM 19.1.7, 256 bits)"
    assert run.matrix_cores == "KHR_coopmat" and run.build_commit == "87ee784"


def test_test_file_cases_read_back_with_the_shapes_ggml_built():
    """Each --test-file case comes back under its name, and the tensors ggml built from the
    line (echoed in its parameters) are the case's: weight k x outputs in its format,
    activations k x rows in float32, output outputs x rows."""
    text = FILE.read_text()
    run = PeerRun("x")
    ggml_peer.read_output(text, FILE_CASES, "test-file", run)
    assert set(run.results) == set(FILE_CASES)
    echoed = {ggml_peer.op_params(r["op_params"])["name"]: r["op_params"]
              for r in ggml_peer.sql_rows(text)}
    for c in FILE_CASES:
        assert run.results[c].us > 0 and run.results[c].source == "test-file"
        assert echoed[c.name] == (
            f"name={c.name},type=f32,ne=[{c.outputs},{c.rows},1,1],op_params=[],"
            f"sources={c.weight}[{c.k},{c.outputs},1,1],f32[{c.k},{c.rows},1,1]")


def test_test_file_lines_are_what_the_sample_was_recorded_from():
    """The recorded sample's input is today's test_file(): each line's fields in ggml's
    reader order (op, type, ne[4], n_params, n_src, then per source type, ne[4], nb[4])."""
    lines = ggml_peer.test_file(FILE_CASES).splitlines()
    assert len(lines) == len(FILE_CASES)
    f = lines[0].split()
    assert f[0] == "29" and f[1] == "0" and f[2:6] == ["48", "1", "1", "1"]
    assert f[6] == "0" and f[7] == "2"
    assert f[8:17] == ["2", "64", "48", "1", "1", "0", "0", "0", "0"]  # q4_0 weight
    assert f[17:26] == ["0", "64", "1", "1", "1", "0", "0", "0", "0"]  # f32 activations
    assert f[26] == FILE_CASES[0].name and len(f) == 27


def test_unsupported_and_foreign_rows():
    """A row ggml marks unsupported lists the case as such; rows of other cases, ops or
    modes are ignored; a row whose values do not match its columns is an error."""
    case = MatMulCase("q8_0", 1, 4096, 4096)
    row = ("INSERT INTO test_backend_ops (op_name, op_params, test_mode, supported, time_us) "
           "VALUES ('MUL_MAT', 'type_a=q8_0,type_b=f32,m=4096,n=1,k=4096,bs=[1,1]', 'perf', "
           "'0', '0.0');")
    foreign = row.replace("'MUL_MAT'", "'ADD'")
    run = PeerRun("x")
    ggml_peer.read_output(foreign + "\n" + row, [case], "builtin", run)
    assert run.unsupported == [case] and not run.results
    with pytest.raises(PeerError, match="unreadable"):
        ggml_peer.sql_rows(row.replace(", '0.0'", ""))


def test_op_params_keep_bracketed_commas():
    assert ggml_peer.op_params("a=1,bs=[1,1],per=[0,1,2,3],name=x") == {
        "a": "1", "bs": "[1,1]", "per": "[0,1,2,3]", "name": "x"}


def test_builtin_pattern_matches_only_the_plain_case():
    import re
    case = MatMulCase("f16", 512, 4096, 14336)
    pat = re.compile(ggml_peer.builtin_pattern([case]))
    plain = ("type_a=f16,type_b=f32,m=4096,n=512,k=14336,bs=[1,1],nr=[1,1],"
             "per=[0,1,2,3],k_v=0,o=1,src_overlap=0")
    assert pat.search(plain)
    for other in (plain.replace("n=512", "n=5120"), plain.replace("per=[0,1,2,3]", "per=[0,2,1,3]"),
                  plain.replace("o=1", "o=2"), plain.replace("f16", "bf16", 1)):
        assert not pat.search(other), other


def test_cases_table_rejects_unknown_formats():
    with pytest.raises(ValueError, match="q5_0"):
        ggml_peer.matmul_cases(["q5_0"], [1], 64, 48)


def test_missing_binary_is_one_line_naming_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(ggml_peer, "UNPACKED", tmp_path / "none")
    with pytest.raises(PeerError) as exc:
        ggml_peer.find_binary(None, [tmp_path])
    msg = str(exc.value)
    assert "\n" not in msg and "--ggml PATH" in msg and str(tmp_path / "none") in msg
    with pytest.raises(PeerError, match="--ggml .*nothing"):
        ggml_peer.find_binary(str(tmp_path / "nothing"))


def _stand_in(tmp_path: Path) -> Path:
    """A tarball laid out as the peer's, whose test-backend-ops prints the recorded
    builtin sample for -p and the --test-file sample for --test-file."""
    script = (f"#!/bin/sh\ncase \"$*\" in *--test-file*) cat '{FILE}';; "
              f"*) cat '{BUILTIN}';; esac\n")
    tar = tmp_path / ggml_peer.TARBALL
    with tarfile.open(tar, "w:xz") as tf:
        info = tarfile.TarInfo("bin/test-backend-ops")
        info.size, info.mode = len(script), 0o755
        tf.addfile(info, io.BytesIO(script.encode()))
    return tar


def test_tarball_found_under_a_checkout_unpacked_and_run(tmp_path, monkeypatch):
    """The tarball where stage.sh copies it is unpacked at UNPACKED, found there next time,
    and run: the builtin pass gives the case in ggml's list, the --test-file pass the rest
    (the environment carries the library folders and the device index)."""
    monkeypatch.setattr(ggml_peer, "UNPACKED", tmp_path / "unpacked")
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    staged = tmp_path / "checkout" / ".gpu-deps" / "ggml-vulkan"
    staged.mkdir(parents=True)
    _stand_in(staged)
    binary = ggml_peer.find_binary(None, [tmp_path / "checkout"])
    assert binary == tmp_path / "unpacked" / "bin" / "test-backend-ops"
    assert binary.stat().st_mode & stat.S_IXUSR
    (staged / ggml_peer.TARBALL).unlink()
    assert ggml_peer.find_binary(None, [tmp_path / "checkout"]) == binary
    env = ggml_peer.environment(binary, 3)
    assert env["GGML_VK_VISIBLE_DEVICES"] == "3"
    top = tmp_path / "unpacked"
    assert env["LD_LIBRARY_PATH"].split(":")[:2] == [str(top / "src"),
                                                      str(top / "src" / "ggml-vulkan")]
    builtin = MatMulCase("q4_0", 1, 4096, 4096)
    run = ggml_peer.run(binary, [builtin, *FILE_CASES[:2]], device_index=0)
    assert run.results[builtin].source == "builtin"
    assert {run.results[c].source for c in FILE_CASES[:2]} == {"test-file"}


def test_a_case_in_neither_output_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ggml_peer, "UNPACKED", tmp_path / "unpacked")
    binary = ggml_peer.find_binary(str(_stand_in(tmp_path)))
    with pytest.raises(PeerError, match="nothing for q4_0 7x64"):
        ggml_peer.run(binary, [MatMulCase("q4_0", 7, 48, 64)])


def test_failing_binary_reports_its_last_lines(tmp_path):
    bad = tmp_path / "test-backend-ops"
    bad.write_text("#!/bin/sh\necho 'ggml_vulkan: Invalid device index 9' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(PeerError, match="exited with 1: ggml_vulkan: Invalid device index 9"):
        ggml_peer.run(bad, FILE_CASES[:1])


def test_extra_environment_reaches_the_binary(tmp_path):
    """`extra_env` (FLOAT32_ACCUMULATION: ggml's float32-accumulating pipelines) is in the
    binary's environment for both passes of that run only."""
    seen = tmp_path / "seen"
    fake = tmp_path / "test-backend-ops"
    fake.write_text(f"#!/bin/sh\necho \"${{GGML_VK_DISABLE_F16:-unset}}\" >> '{seen}'\n"
                    f"case \"$*\" in *--test-file*) cat '{FILE}';; *) cat '{BUILTIN}';; esac\n")
    fake.chmod(0o755)
    ggml_peer.run(fake, FILE_CASES[:1], extra_env=ggml_peer.FLOAT32_ACCUMULATION)
    ggml_peer.run(fake, FILE_CASES[:1])
    assert seen.read_text().split() == ["1", "1", "unset", "unset"]

