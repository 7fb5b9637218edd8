"""The Dockerfile builds what CI builds. No Docker engine runs here, so the
file itself is checked against the workspace and scripts/test."""

import re
import tomllib

from helpers import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def stages():
    out, name = {}, None
    for line in DOCKERFILE.splitlines():
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def workspace_packages():
    root = tomllib.loads((ROOT / "Cargo.toml").read_text())
    pkgs = {}
    for member in root["workspace"]["members"]:
        manifest = tomllib.loads((ROOT / member / "Cargo.toml").read_text())
        bins = [b["name"] for b in manifest.get("bin", [])]
        pkgs[manifest["package"]["name"]] = bins
    return pkgs


def cargo_build_line():
    (line,) = re.findall(r"cargo build[^\n&]*", DOCKERFILE)
    return line


def test_build_is_locked_release_like_ci():
    line = cargo_build_line()
    assert "--locked" in line and "--release" in line
    ci = (ROOT / "scripts" / "test").read_text()
    assert "--locked" in ci, "CI builds with --locked; so must the image"


def test_builds_the_packages_whose_binaries_it_copies():
    pkgs = workspace_packages()
    built = re.findall(r"-p (\S+)", cargo_build_line())
    assert sorted(built) == ["ferrox-operator", "ferrox-router", "ferrox-server"]
    for p in built:
        assert p in pkgs, f"{p} is not a workspace package"
        assert p in pkgs[p], f"package {p} has no binary {p} (it has {pkgs[p]})"
    copied = re.findall(r"target/release/(\S+)", DOCKERFILE)
    assert sorted(copied) == sorted(built)


def test_targets_run_the_right_binary_as_non_root():
    s = stages()
    assert {"build", "model", "operator", "router", "server"} <= set(s)
    for target, binary in (("operator", "ferrox-operator"), ("router", "ferrox-router"),
                           ("server", "ferrox-server")):
        body = s[target]
        assert f"COPY --from=build /out/{binary} /usr/local/bin/{binary}" in body
        assert f'ENTRYPOINT ["/usr/local/bin/{binary}"]' in body
        (user,) = re.findall(r"^USER\s+(\S+)", body, re.M)
        uid = user.split(":")[0]
        # Numeric, so that the pod's runAsNonRoot can verify it; 65532 is what
        # the chart and the operator's server pods set as runAsUser.
        assert uid == "65532", user


def test_server_image_serves_models_from_a_volume():
    body = stages()["server"]
    assert 'VOLUME ["/models"]' in body
    assert "COPY --from=model /src/models/ /models/" in body
    model = stages()["model"]
    assert "ARG BAKE_MODEL=0" in model and "scripts/fetch-model" in model
    assert (ROOT / "scripts" / "fetch-model").is_file()
    # The operator's Deployments pass `serve ...` as args: the entrypoint must be the server.
    assert "/bin/sh" not in body.split("ENTRYPOINT")[1]


def test_dockerignore_keeps_build_outputs_and_models_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for p in ("/target", "/models", "/.git"):
        assert p in ignored
    # ...but not what the build needs.
    for needed in ("Cargo.lock", "/scripts", "/server", "/operator"):
        assert needed not in ignored
