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

/// `scripts/bench_compare.py` (the same-session table of docs/benchmarks.md)
/// on a small pair of JSON files in the formats `dsv4-kvcache bench --out`
/// and `scripts/seed/seed_bench.py --out` write.
#[test]
fn bench_compare_script_makes_the_table() {
    let dir = std::env::temp_dir().join(format!("dsv4-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ours = dir.join("bench.json");
    let seed = dir.join("seed_bench.json");
    std::fs::write(
        &ours,
        r#"{"copy_bytes_per_s": 2.5e12, "rows": [
            {"op": "insert mxfp8", "tokens": 1, "us_per_launch": 1.0, "fraction_of_copy": 0.001},
            {"op": "insert mxfp8", "tokens": 16, "us_per_launch": 4.0, "fraction_of_copy": 0.8}]}"#,
    )
    .expect("write");
    std::fs::write(
        &seed,
        r#"{"tokens": [1, 16], "copy": {"1 GiB": {"TB_per_s_read_plus_write": 2.6}},
            "us_per_launch": {"seed insert MXFP8 (528 B)": {"1": 2.0, "16": 2.0}}}"#,
    )
    .expect("write");
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/bench_compare.py"))
        .arg(&ours)
        .arg(&seed)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "*** SKIPPED bench_compare_script_makes_the_table: python3 not runnable: {e} ***"
            );
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "| insert mxfp8 | seed kernel | 1.00 / 2.00 = **2.00x** | 4.00 / 2.00 = **0.50x** |"
        ),
        "{text}"
    );
    assert!(
        text.contains("insert mxfp8 at T = 16: 80.0 % of copy"),
        "{text}"
    );
    // Ops without rows print a dash rather than failing.
    assert!(
        text.contains("| insert nvfp4 | seed kernel | — | — |"),
        "{text}"
    );
}
