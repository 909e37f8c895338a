//! The ROCm CI scripts cannot run here (no AMD GPU, no ROCm container), nor
//! can `scripts/hip-on-cuda.sh` (no NVIDIA GPU): check what can be checked,
//! that the workflow parses and calls the scripts, that every test target,
//! CLI subcommand and file the scripts name exists in the project, and that
//! the NVIDIA script says SKIPPED where there is no NVIDIA GPU.

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

/// The hosted-runner job: the ROCm container without a GPU, running the
/// build script; and the whole file parses as YAML where PyYAML is there.
#[test]
fn rocm_workflow_has_a_hosted_build_job() {
    let wf = std::fs::read_to_string(root().join(".github/workflows/rocm.yml"))
        .expect("workflow exists");
    assert!(!wf.contains('\t'), "YAML forbids tabs");
    let job = wf
        .split("\n  hip-build:\n")
        .nth(1)
        .expect("a hip-build job")
        .split("\n  hip:\n")
        .next()
        .expect("job text");
    assert!(job.contains("runs-on: ubuntu-"), "hosted runner: {job}");
    assert!(job.contains("image: rocm/dev-ubuntu-24.04"), "{job}");
    assert!(
        !job.contains("/dev/kfd"),
        "no GPU devices on hosted runners"
    );
    assert!(job.contains("bash scripts/rocm-build-ci.sh"), "{job}");
    for line in wf.lines().filter(|l| l.contains("bash scripts/")) {
        let script = line.split("bash ").nth(1).expect("path").trim();
        assert!(root().join(script).is_file(), "{script} is missing");
    }
    let parsed = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print(sorted(d['jobs']))")
        .arg(root().join(".github/workflows/rocm.yml"))
        .output();
    match parsed {
        Ok(o) if o.status.success() => {
            let jobs = String::from_utf8_lossy(&o.stdout);
            assert!(
                jobs.contains("'hip-build'") && jobs.contains("'hip'"),
                "{jobs}"
            );
        }
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'yaml'") => {
            eprintln!("*** SKIPPED YAML parse of rocm.yml: python3 has no PyYAML ***")
        }
        Ok(o) => panic!(
            "rocm.yml does not parse: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => eprintln!("*** SKIPPED YAML parse of rocm.yml: python3 not runnable: {e} ***"),
    }
}

/// Test targets (`--test NAME`, or `$bin/NAME` in a bundle) and CLI
/// subcommands a script names exist; the script passes `bash -n`.
fn script_names_only_existing_things(script: &str, test_marker: &str) -> usize {
    let sh = std::fs::read_to_string(root().join(script)).expect("script exists");
    let mut tests = 0;
    for w in sh.split(test_marker).skip(1) {
        let name: String = w
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        if name == "dsv4-kvcache" {
            continue;
        }
        assert!(
            root().join(format!("tests/{name}.rs")).is_file(),
            "{script}: no test target {name}"
        );
        tests += 1;
    }
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_dsv4-kvcache"))
        .arg("--help")
        .output()
        .expect("the CLI runs");
    let help =
        String::from_utf8_lossy(&help.stdout).to_string() + &String::from_utf8_lossy(&help.stderr);
    for line in sh
        .lines()
        .filter(|l| l.contains("dsv4-kvcache\" ") || l.contains("dsv4-kvcache "))
    {
        let rest = line
            .split("dsv4-kvcache\" ")
            .nth(1)
            .or_else(|| line.split("dsv4-kvcache ").nth(1));
        let Some(sub) = rest.and_then(|r| r.split_whitespace().next()) else {
            continue;
        };
        if !sub.chars().all(|c| c.is_ascii_lowercase()) {
            continue;
        }
        assert!(
            help.contains(&format!("dsv4-kvcache {sub}")),
            "{script}: CLI has no subcommand {sub}"
        );
    }
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(root().join(script))
        .status();
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "bash -n {script}"
    );
    tests
}

#[test]
fn rocm_build_script_names_only_existing_things() {
    script_names_only_existing_things("scripts/rocm-build-ci.sh", "--test ");
    let sh = std::fs::read_to_string(root().join("scripts/rocm-build-ci.sh")).expect("script");
    assert!(sh.contains("DSV4_KVCACHE_REQUIRE_ROCM_HEADERS=1"));
    assert!(sh.contains("-p hip-on-cuda") && root().join("hip-on-cuda/Cargo.toml").is_file());
}

/// `scripts/hip-on-cuda.sh`: names only existing test targets, runs the
/// same eight kernel mappings as the ROCm script, and says SKIPPED (exit 0)
/// where there is no NVIDIA GPU.
#[test]
fn hip_on_cuda_script() {
    let tests = script_names_only_existing_things("scripts/hip-on-cuda.sh", "$bin/");
    assert!(tests >= 3, "the script runs the device tests");
    let sh = std::fs::read_to_string(root().join("scripts/hip-on-cuda.sh")).expect("script");
    let rocm = std::fs::read_to_string(root().join("scripts/rocm-ci.sh")).expect("script");
    // device_parity runs the eight kernel mappings itself
    // (LaunchPolicy::MAPPINGS), so neither script forces one around it.
    for (name, text) in [("rocm-ci.sh", &rocm), ("hip-on-cuda.sh", &sh)] {
        let joined = text.replace("\\\n", " ");
        for line in joined.lines().filter(|l| l.contains("device_parity")) {
            for var in [
                "DSV4_KVCACHE_CR2_TEAMS",
                "DSV4_KVCACHE_CR2_SCREEN",
                "DSV4_KVCACHE_INSERT_TILES",
                "DSV4_KVCACHE_INSERT_LARGE",
                "DSV4_KVCACHE_CR2_SPREAD",
                "DSV4_KVCACHE_GROUPS_PER_BLOCK",
            ] {
                assert!(
                    !line.contains(var),
                    "{name} forces {var} around device_parity: {line}"
                );
            }
        }
        assert!(text.contains("device_parity"), "{name} runs device_parity");
    }
    let has_gpu = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_gpu {
        eprintln!("*** SKIPPED the no-GPU behaviour of hip-on-cuda.sh: this machine has an NVIDIA GPU ***");
        return;
    }
    let dir = std::env::temp_dir().join(format!("dsv4-hipcuda-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = std::process::Command::new("bash")
        .arg(root().join("scripts/hip-on-cuda.sh"))
        .arg("run")
        .arg(&dir)
        .output()
        .expect("bash runs");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with("SKIPPED: hip-on-cuda: no NVIDIA GPU"),
        "{text}"
    );
}

#[test]
fn rocm_script_names_only_existing_things() {
    let tests = script_names_only_existing_things("scripts/rocm-ci.sh", "--test ");
    assert!(tests >= 3, "the script runs the device tests");
    assert!(root().join("tests/vectors").is_dir());
    assert!(root().join("scripts/rocm-env.sh").is_file());
}

/// `scripts/bench_compare.py` (the peer table of docs/benchmarks.md)
/// on a small pair of JSON files in the formats `dsv4-kvcache bench --out`
/// and `scripts/peers/seed_bench.py --out` write.
#[test]
fn bench_compare_script_makes_the_table() {
    let dir = std::env::temp_dir().join(format!("dsv4-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ours = dir.join("bench.json");
    let seed = dir.join("seed_bench.json");
    std::fs::write(
        &ours,
        r#"{"roofline_bytes_per_s": 4.2e12, "copy_engine_bytes_per_s": 2.5e12, "rows": [
            {"op": "insert mxfp8", "tokens": 1, "us_per_launch": 1.0, "fraction_of_roofline": 0.001},
            {"op": "insert mxfp8", "tokens": 16, "us_per_launch": 4.0, "fraction_of_roofline": 0.8}]}"#,
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
        text.contains("insert mxfp8 at T = 16: 80.0 % of roofline"),
        "{text}"
    );
    // Ops without rows print a dash rather than failing.
    assert!(
        text.contains("| insert nvfp4 | seed kernel | — | — |"),
        "{text}"
    );
}

/// A stub build for `scripts/bench_builds.sh`: a shell script that appends
/// its name to `order` and writes a bench JSON whose insert row takes `us`
/// (its first run `first_us`) and whose fused row takes `fused_us`.
fn stub_build(dir: &Path, name: &str, first_us: f64, us: f64, fused_us: f64) -> std::path::PathBuf {
    let path = dir.join(format!("stub-{name}"));
    let script = format!(
        r#"#!/usr/bin/env bash
[ "$1" = bench ] || exit 2
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out="$2"; shift; done
echo {name} >> "{dir}/order"
us={us}; [ "$(grep -c {name} "{dir}/order")" = 1 ] && us={first_us}
cat > "$out" <<JSON
{{"roofline_bytes_per_s": 4.2e12, "rows": [
  {{"op": "insert fp8", "tokens": 16, "us_per_launch": 2.0, "fraction_of_roofline": 0.01}},
  {{"op": "insert fp8", "tokens": 65536, "us_per_launch": $us, "fraction_of_roofline": 0.8}}],
 "fused": [{{"case": "CR1", "layout": "fp8", "tokens": 16, "fused_us": {fused_us}}}]}}
JSON
"#,
        dir = dir.display()
    );
    std::fs::write(&path, script).expect("write stub");
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status();
    assert!(status.map(|s| s.success()).unwrap_or(false), "chmod");
    path
}

/// `scripts/bench_builds.sh` runs the builds interleaved, the order reversed
/// in every other round, and `scripts/bench_builds.py` makes the table:
/// best round per build, the change against the base, the noise (the
/// largest spread of one build's rounds), bold and SLOWER beyond it, and
/// exit status 1 with `--fail-slower`.
#[test]
fn bench_builds_scripts_interleave_and_compare() {
    let dir = std::env::temp_dir().join(format!("dsv4-bench-builds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // old: 31.0 µs at 65536 tokens, its first round 31.31 (1 % noise);
    // new: 32.0 µs (3.2 % slower, beyond the noise), fused 1.00 vs 1.005.
    let old = stub_build(&dir, "old", 31.31, 31.0, 1.0);
    let new = stub_build(&dir, "new", 32.0, 32.0, 1.005);
    let out = dir.join("runs");
    let run = std::process::Command::new("bash")
        .arg(root().join("scripts/bench_builds.sh"))
        .arg(&out)
        .arg("3")
        .arg(format!("old={}", old.display()))
        .arg(format!("new={}", new.display()))
        .args(["--", "--backend", "cuda", "--only", "insert"])
        .output();
    let run = match run {
        Ok(o) => o,
        Err(e) => {
            eprintln!("*** SKIPPED bench_builds_scripts_interleave_and_compare: bash not runnable: {e} ***");
            return;
        }
    };
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let order = std::fs::read_to_string(dir.join("order")).expect("order");
    assert_eq!(
        order.split_whitespace().collect::<Vec<_>>(),
        ["old", "new", "new", "old", "old", "new"]
    );
    for r in 1..=3 {
        for b in ["old", "new"] {
            assert!(
                out.join(format!("b{r}-{b}.json")).is_file(),
                "b{r}-{b}.json"
            );
        }
    }
    let compare = |extra: &[&str]| {
        std::process::Command::new("python3")
            .arg(root().join("scripts/bench_builds.py"))
            .arg(&out)
            .args(extra)
            .output()
    };
    let table = match compare(&["--base", "old"]) {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("*** SKIPPED bench_builds_scripts_interleave_and_compare: python3 not runnable: {e} ***");
            return;
        }
    };
    let text = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    // Columns in sort order (new, old); old is the base.
    assert!(
        text.contains("| op | T | new µs | old µs | noise |"),
        "{text}"
    );
    assert!(
        text.contains("| insert fp8 | 16 | 2.00, +0.0 % | 2.00 | 0.0 % |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| insert fp8 | 65536 | 32.00 (80.0 %), **+3.2 %** | 31.00 (80.0 %) | 1.0 % |"
        ),
        "{text}"
    );
    assert!(
        text.contains("| fused CR1 fp8 | 16 | 1.00, **+0.5 %** | 1.00 | 0.0 % |"),
        "{text}"
    );
    assert!(
        text.contains("SLOWER: new insert fp8 T = 65536: +3.2 % (noise 1.0 %)"),
        "{text}"
    );
    let failing = compare(&["--base", "old", "--fail-slower"]).expect("python3 ran before");
    assert_eq!(
        failing.status.code(),
        Some(1),
        "--fail-slower with a slower row"
    );
    let other_way = compare(&["--base", "new", "--fail-slower"]).expect("python3 ran before");
    assert_eq!(other_way.status.code(), Some(0), "nothing slower than new");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/gpu-check.sh` (the CUDA-side checks on an NVIDIA machine) names
/// only existing test targets and subcommands.
#[test]
fn gpu_check_script_names_only_existing_things() {
    let tests = script_names_only_existing_things("scripts/gpu-check.sh", "$bin/");
    assert!(tests >= 4, "gpu-check.sh runs {tests} test binaries");
}

/// The `torch` extra's floor is what CI tests the wheel beside: pyproject's
/// `torch>=X.Y`, and scripts/test.sh runs scripts/test-wheel.sh with
/// `torch==X.Y.0` and with the newest torch, which test-wheel.sh installs
/// (TORCH_SPEC) and checks is the version that imports.
#[test]
fn torch_floor_is_the_tested_torch() {
    let pyproject =
        std::fs::read_to_string(root().join("python/pyproject.toml")).expect("pyproject.toml");
    let floor = pyproject
        .lines()
        .find_map(|l| l.trim().strip_prefix("torch = [\"torch>="))
        .and_then(|r| r.split('"').next())
        .expect("a torch>=X.Y extra");
    assert_eq!(floor, "2.9", "the extra's floor is vLLM's torch pin");
    let test = std::fs::read_to_string(root().join("scripts/test.sh")).expect("test.sh");
    let line = test
        .lines()
        .find(|l| l.trim_start().starts_with("for torch_spec in "))
        .expect("test.sh loops over torch versions");
    let specs: Vec<&str> = line
        .trim_start()
        .trim_start_matches("for torch_spec in ")
        .trim_end_matches("; do")
        .split_whitespace()
        .collect();
    assert_eq!(specs, [format!("torch=={floor}.0").as_str(), "torch"]);
    assert!(test.contains("TORCH_SPEC=$torch_spec") && test.contains("scripts/test-wheel.sh"));
    let wheel =
        std::fs::read_to_string(root().join("scripts/test-wheel.sh")).expect("test-wheel.sh");
    assert!(
        wheel.contains("\"$TORCH_SPEC\" pytest"),
        "test-wheel.sh installs TORCH_SPEC"
    );
    assert!(wheel.contains("torch.__version__.split(\"+\")[0] == want"));
}

/// `scripts/build-wheel.sh`'s architectures: an unknown one is refused
/// before anything is built; the aarch64 path cross-builds with its rustup
/// target and checks the aarch64 tag and machine. A built aarch64 wheel
/// (scripts/test.sh makes one in target/wheels-aarch64) is checked here:
/// its tags, an AArch64 extension module, and a glibc no newer than 2.28.
#[test]
fn build_wheel_architectures() {
    let out = std::env::temp_dir().join(format!("dsv4-wheel-arch-{}", std::process::id()));
    let run = std::process::Command::new("bash")
        .arg(root().join("scripts/build-wheel.sh"))
        .arg(&out)
        .arg("riscv64")
        .output()
        .expect("bash runs");
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(
        run.status.code(),
        Some(2),
        "an unknown architecture is refused"
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("unknown architecture riscv64"));
    let sh = std::fs::read_to_string(root().join("scripts/build-wheel.sh")).expect("script");
    for needle in [
        "x86_64 | aarch64)",
        "TARGET=$ARCH-unknown-linux-gnu",
        "rustup target add \"$TARGET\"",
        "\"${POLICY}_$ARCH",
        "\"aarch64\": \"AArch64\"",
    ] {
        assert!(sh.contains(needle), "build-wheel.sh lacks `{needle}`");
    }
    for script in ["scripts/build-wheel.sh", "scripts/aarch64-qemu.sh"] {
        let status = std::process::Command::new("bash")
            .arg("-n")
            .arg(root().join(script))
            .status();
        assert!(status.is_ok_and(|s| s.success()), "bash -n {script}");
    }
    let test = std::fs::read_to_string(root().join("scripts/test.sh")).expect("test.sh");
    assert!(
        test.contains("scripts/build-wheel.sh target/wheels-aarch64 aarch64")
            && test.contains("scripts/aarch64-qemu.sh target/wheels-aarch64/"),
        "test.sh builds and runs the aarch64 wheel"
    );
    let dir = root().join("target/wheels-aarch64");
    let wheel = std::fs::read_dir(&dir).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".whl"))
    });
    let Some(wheel) = wheel else {
        eprintln!(
            "*** SKIPPED the built aarch64 wheel's checks: none in {} (scripts/test.sh builds one) ***",
            dir.display()
        );
        return;
    };
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.ends_with("-cp39-abi3-manylinux_2_28_aarch64.whl"),
        "{name}"
    );
    let check = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import re, subprocess, sys, tempfile, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1]); so = [n for n in z.namelist() if n.endswith('.so')]\n\
             d = tempfile.mkdtemp(); p = z.extract(so[0], d)\n\
             h = subprocess.run(['readelf', '-h', p], capture_output=True, text=True, check=True).stdout\n\
             s = subprocess.run(['readelf', '--dyn-syms', '-W', p], capture_output=True, text=True, check=True).stdout\n\
             v = max(tuple(int(x) for x in m.split('.')) for m in re.findall(r'GLIBC_(\\d+(?:\\.\\d+)+)', s))\n\
             print('AArch64' in h, v <= (2, 28))",
        )
        .arg(&wheel)
        .output();
    match check {
        Ok(o) if o.status.success() => {
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                "True True",
                "{name}"
            )
        }
        Ok(o) => panic!("{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("*** SKIPPED the aarch64 wheel's ELF check: python3 not runnable: {e} ***")
        }
    }
}
