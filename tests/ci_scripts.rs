//! The ROCm CI script cannot run here (no AMD GPU): check what can be
//! checked, that the workflow calls the script and that every test target,
//! CLI subcommand and file the script names exists in the project.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn rocm_workflow_runs_the_script() {
    let wf = std::fs::read_to_string(root().join(".github/workflows/rocm.yml"))
        .expect("workflow exists");
    assert!(wf.contains("bash scripts/rocm-ci.sh"));
    assert!(wf.contains("rocm/dev-ubuntu-24.04"));
    assert!(root().join("scripts/rocm-ci.sh").is_file());
}

#[test]
fn rocm_script_names_only_existing_things() {
    let sh = std::fs::read_to_string(root().join("scripts/rocm-ci.sh")).expect("script exists");
    let mut tests = 0;
    for w in sh.split("--test ").skip(1) {
        let name = w.split_whitespace().next().expect("a test name");
        assert!(
            root().join(format!("tests/{name}.rs")).is_file(),
            "no test target {name}"
        );
        tests += 1;
    }
    assert!(tests >= 3, "the script runs the device tests");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_dsv4-kvcache"))
        .arg("--help")
        .output()
        .expect("the CLI runs");
    let help =
        String::from_utf8_lossy(&help.stdout).to_string() + &String::from_utf8_lossy(&help.stderr);
    for line in sh.lines().filter(|l| l.contains("dsv4-kvcache ")) {
        let sub = line
            .split("dsv4-kvcache ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("subcommand");
        assert!(
            help.contains(&format!("dsv4-kvcache {sub}")),
            "CLI has no subcommand {sub}"
        );
    }
    assert!(root().join("tests/vectors").is_dir());
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(root().join("scripts/rocm-ci.sh"))
        .status();
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "bash -n scripts/rocm-ci.sh"
    );
}
