//! The committed reference models are what `scripts/reference-models`
//! writes today: regenerated and compared where the venv with torch and
//! transformers is (a developer's machine); CI has none and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    std::env::var_os("FERROX_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root/.cache/ferrox/venv-ref/bin/python".into())
}

#[test]
fn the_committed_references_have_not_drifted() {
    let py = python();
    let ready = Command::new(&py)
        .args(["-c", "import torch, transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        eprintln!(
            "skipping: {} has no torch and transformers (FERROX_REF_PYTHON); \
             the committed references are not regenerated here",
            py.display()
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reference-models");
    let out = Command::new(script)
        .arg("--check")
        .env("FERROX_REF_PYTHON", &py)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the references drifted (run scripts/reference-models):\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
