"""The Dockerfile's CUDA server target builds as scripts/build-cuda does and
carries the runtime libraries the binary loads; the default target stays the
CPU server."""

import re

from helpers import ROOT
from test_dockerfile import DOCKERFILE, stages

# What a candle CUDA build loads at run time besides the driver's libcuda.so.1
# (/work/shared/notes/cuda-build.md).
RUNTIME_LIBS = ["libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudart.so.13",
                "libnvrtc.so.13"]


def test_default_target_is_still_the_cpu_server():
    last = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE, re.M | re.I)[-1]
    assert last == "server"
    assert "--features" not in stages()["server"]


def test_cuda_build_is_scripts_build_cuda():
    body = stages()["build-cuda"]
    assert re.search(r"^\s*CUDA_COMPUTE_CAP=\$\{CUDA_COMPUTE_CAP\} scripts/build-cuda", body, re.M)
    script = (ROOT / "scripts" / "build-cuda").read_text()
    # The stripped binary build-cuda leaves next to its .xz.
    assert 'out="$target/ferrox-server-cuda"' in script
    assert "cp target/cuda/ferrox-server-cuda /out/ferrox-server" in body


def test_runtime_libraries_are_the_pinned_wheels():
    libs = stages()["cuda-libs"]
    pinned = set(re.findall(r"(nvidia-[a-z-]+==[\d.]+)", (ROOT / "scripts/cuda-env").read_text()))
    used = set(re.findall(r"(nvidia-[a-z-]+==[\d.]+)", libs))
    assert used and used <= pinned, used - pinned
    for lib in RUNTIME_LIBS:
        assert re.search(rf"\b{re.escape(lib)}\b", libs), lib


def test_cuda_server_runs_like_the_cpu_server_with_the_libraries_on_its_path():
    body = stages()["server-cuda"]
    assert "COPY --from=build-cuda /out/ferrox-server /usr/local/bin/ferrox-server" in body
    assert 'ENTRYPOINT ["/usr/local/bin/ferrox-server"]' in body
    assert re.findall(r"^USER\s+(\S+)", body, re.M) == ["65532:65532"]
    assert 'VOLUME ["/models"]' in body and "COPY --from=model /src/models/ /models/" in body
    (dest,) = re.findall(r"COPY --from=cuda-libs /cuda/ (\S+)/", body)
    assert f"LD_LIBRARY_PATH={dest}" in body
    assert "NVIDIA_DRIVER_CAPABILITIES=compute" in body
