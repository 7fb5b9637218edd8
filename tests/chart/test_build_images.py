"""scripts/build-images builds what the Dockerfile defines and the real node
installs. No buildah runs here: the script's TARGETS and host-mode context are
checked against the Dockerfile's stages and tests/e2e/real-node.sh."""

import re

from helpers import ROOT
from test_dockerfile import stages

SCRIPT = (ROOT / "scripts" / "build-images").read_text()
REAL_NODE = (ROOT / "tests" / "e2e" / "real-node.sh").read_text()


def targets():
    (body,) = re.findall(r"^TARGETS=\(\n(.*?)^\)", SCRIPT, re.M | re.S)
    return [tuple(line.strip().strip('"').split("|")) for line in body.splitlines() if line.strip()]


def host_context():
    (body,) = re.findall(r"^host_context\(\) \{\n(.*?)^\}", SCRIPT, re.M | re.S)
    return body


# archive name -> (Dockerfile target, build-arg): every image the project ships.
WANT = {
    "ferrox-operator": ("operator", ""),
    "ferrox-router": ("router", ""),
    "ferrox-server": ("server", ""),
    "ferrox-server-smollm2": ("server", "BAKE_MODEL=1"),
}


def test_targets_are_the_dockerfile_stages():
    got = {name: (target, arg) for name, target, arg in targets()}
    assert len(got) == len(targets()), "archive names are unique"
    assert got == WANT
    s = stages()
    for target, arg in got.values():
        assert target in s, f"no stage {target} in the Dockerfile"
        if arg:
            key = arg.split("=")[0]
            assert re.search(rf"ARG {key}\b", "\n".join(s.values())), arg


def test_host_mode_builds_and_copies_every_binary_the_stages_take():
    # Host mode stands in for the `build` stage: DIR/out/ must hold each binary
    # a built target copies from it, built when missing.
    s = stages()
    needed = set()
    for _, target, _ in targets():
        needed |= set(re.findall(r"COPY --from=build /out/(\S+) ", s[target]))
    assert needed == {"ferrox-operator", "ferrox-router", "ferrox-server"}
    body = host_context()
    (check,) = re.findall(r"if \[\[ (.*?) \]\]; then", body)
    assert set(re.findall(r'! -x "\$bin/(\S+)"', check)) == needed, "the built-only-if-missing check"
    (build,) = re.findall(r"cargo build [^)]*", body)
    assert set(re.findall(r"-p (\S+)", build)) == needed and "--locked" in build
    (loop,) = re.findall(r"for b in ([^;]+); do", body)
    assert set(loop.split()) == needed, "the binaries copied into the context"


def test_real_node_imports_every_archive_and_installs_the_router_from_it():
    n = len(targets())
    assert f"scripts/build-images | tail -n{n})" in REAL_NODE
    assert f"((${{#IMAGES[@]}} == {n}))" in REAL_NODE
    (install,) = re.findall(r'^helm install "\$RELEASE" charts/ferrox.*?(?<!\\)\n', REAL_NODE, re.M | re.S)
    # build-images tags every archive localhost/<name>:latest.
    assert '-t "localhost/$name:latest"' in SCRIPT
    for key, value in (
        ("image.repository", "localhost/ferrox-operator"), ("image.tag", "latest"),
        ("router.image.repository", "localhost/ferrox-router"), ("router.image.tag", "latest"),
    ):
        assert f"--set {key}={value}" in install, key
    (bins,) = re.findall(r"cargo build -q --locked ([^\n]*)", REAL_NODE)
    assert "-p ferrox-router" in bins
