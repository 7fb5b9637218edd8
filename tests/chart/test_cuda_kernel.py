"""The CUDA paged-attention kernel (server/models/src/mixer/attention/paged/paged_attention.cu)
is compiled at run time with NVRTC, which a CPU machine has too: CI compiles
it with NVRTC 13.0 (the PyPI wheel tests/chart/run installs, the same major
version the GPU machines run), with no headers, as the server does, so a
kernel that would not build on the GPU fails here."""

import json
import os
import pathlib
import subprocess
import sys

from helpers import ROOT

SOURCE = ROOT / "server" / "models" / "src" / "mixer" / "attention" / "paged" / "paged_attention.cu"
ENTRIES = [f"ferrox_paged_attention_{t}" for t in ("f32", "f16", "bf16")]

# Runs in a child whose loader path holds the wheel's libraries (NVRTC loads
# its builtins library by name).
COMPILE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
src = open(sys.argv[2], "rb").read()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"paged_attention.cu", 0, None, None) == 0
rc = lib.nvrtcCompileProgram(prog, 0, None)
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
ptx = ""
if rc == 0:
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    ptx = buf.value.decode()
print(json.dumps({"rc": rc, "log": log.value.decode(errors="replace"), "ptx": ptx}))
"""


def nvrtc_dir() -> pathlib.Path:
    import nvidia  # the nvidia-cuda-nvrtc wheel's namespace package

    for root in nvidia.__path__:
        lib = pathlib.Path(root) / "cu13" / "lib"
        if (lib / "libnvrtc.so.13").exists():
            return lib
    raise AssertionError("nvidia-cuda-nvrtc 13 is not installed (tests/chart/run installs it)")


def compile_kernel(source: bytes, tmp_path) -> dict:
    lib = nvrtc_dir()
    src = tmp_path / "paged_attention.cu"
    src.write_bytes(source)
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    out = subprocess.run([sys.executable, "-c", COMPILE, str(lib / "libnvrtc.so.13"), str(src)],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(out.stdout)


def test_the_kernel_compiles_with_nvrtc_and_has_its_entry_points(tmp_path):
    got = compile_kernel(SOURCE.read_bytes(), tmp_path)
    assert got["rc"] == 0, got["log"]
    entries = [line.split("(")[0].split()[-1] for line in got["ptx"].splitlines()
               if ".entry" in line]
    assert entries == ENTRIES


def test_a_broken_kernel_is_caught(tmp_path):
    # The check can fail: a kernel calling an undeclared function does not build.
    broken = SOURCE.read_bytes().replace(b"warp_sum(s)", b"warp_sum_missing(s)")
    got = compile_kernel(broken, tmp_path)
    assert got["rc"] != 0 and "warp_sum_missing" in got["log"]


def test_the_rust_side_names_the_same_entry_points():
    rust = (SOURCE.parent / "cuda.rs").read_text()
    for name in ENTRIES:
        assert f'"{name}"' in rust, name


