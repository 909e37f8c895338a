//! The real HIP runtime on a machine without an AMD GPU: ROCm 6.4.3's
//! `libamdhip64.so.6`, extracted from Debian by scripts/install-toolchains.sh
//! into `.toolchains/rocm`, loaded by the HIP backend.
//!
//! That library needs glibc 2.38 and GLIBCXX_3.4.32, newer than the build
//! machines' Debian 12 (glibc 2.36), so it cannot be loaded into a process
//! started by the system's loader. Each check therefore runs in a child
//! process started through `.toolchains/rocm/bin/sid-run`: Debian sid's
//! `ld-linux-x86-64.so.2` with sid's libraries first on the search path (a
//! program built against glibc 2.36 runs on 2.43 unchanged). The child finds
//! `libamdhip64.so` on that path, as a ROCm host's loader would.
//!
//! Without the extracted ROCm the tests print SKIPPED, unless
//! `DSV4_KVCACHE_REQUIRE_KERNELS=1` (CI), where that is a failure.

#![cfg(feature = "hip")]

mod maps;

use dsv4_kvcache::backend::hip::{probe, HipBackend, HipDriver};
use dsv4_kvcache::Error;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child process: the test body to run under sid's loader.
const CHILD: &str = "DSV4_KVCACHE_ROCM_RUNTIME_CHILD";

fn rocm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".toolchains/rocm")
}

/// `sid-run`, or None after a loud SKIPPED (a failure when required).
fn sid_run(test: &str) -> Option<PathBuf> {
    let run = rocm().join("bin/sid-run");
    if run.exists() {
        return Some(run);
    }
    assert!(
        std::env::var("DSV4_KVCACHE_REQUIRE_KERNELS").map_or(true, |v| v.trim() != "1"),
        "DSV4_KVCACHE_REQUIRE_KERNELS=1 but {} is missing (run scripts/install-toolchains.sh)",
        run.display()
    );
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: {test}: no ROCm runtime in {} (scripts/install-toolchains.sh extracts it) ***\n",
        rocm().display()
    );
    None
}

/// The extracted runtime's real file, as the loader reports it.
fn runtime_file() -> String {
    let f = rocm().join("lib/libamdhip64.so.6");
    std::fs::canonicalize(&f)
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        .to_string_lossy()
        .into_owned()
}

/// Runs this test binary's `test` under sid's loader with CHILD set to
/// `value`; returns its output after checking that it passed.
fn run_child(run: &Path, test: &str, value: &str) -> String {
    let me = std::env::current_exe().expect("test binary path");
    let out = Command::new(run)
        .arg(&me)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, value)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("ROCM_PATH")
        .output()
        .expect("starting the child under sid's loader");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the child under {} failed ({}):\n{text}",
        run.display(),
        out.status
    );
    assert!(
        text.contains("1 passed"),
        "the child did not run {test}:\n{text}"
    );
    text
}

/// The symbols src/backend/hip/ffi.rs declares, read from its table.
fn declared_symbols() -> Vec<String> {
    let src = include_str!("../src/backend/hip/ffi.rs");
    let v: Vec<String> = src
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(" = \"hip")?;
            let (name, _) = rest.split_once("\":")?;
            Some(format!("hip{name}"))
        })
        .collect();
    assert!(v.len() > 30, "ffi.rs's table was not read: {v:?}");
    v
}

/// Resident set size in bytes (Linux).
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn real_runtime_symbols_and_no_device() {
    if std::env::var_os(CHILD).is_some() {
        // In the child, under sid's loader.
        let file = runtime_file();
        // SAFETY: the HIP runtime's initializers; nothing is called.
        let lib = unsafe { libloading::Library::new("libamdhip64.so.6") }
            .unwrap_or_else(|e| panic!("libamdhip64.so.6 does not load: {e}"));
        let missing: Vec<String> = declared_symbols()
            .into_iter()
            .filter(|s| unsafe { lib.get::<*const u8>(format!("{s}\0").as_bytes()) }.is_err())
            .collect();
        assert!(missing.is_empty(), "ROCm 6.4.3's {file} lacks {missing:?}");
        assert!(HipDriver::library_present());
        let reason = match HipBackend::new(0) {
            Err(Error::Unavailable {
                backend: "hip",
                reason,
            }) => reason,
            Err(e) => panic!("HipBackend::new(0): unexpected error kind: {e}"),
            Ok(_) => panic!("HipBackend::new(0) opened a device on a machine without an AMD GPU"),
        };
        println!("HipBackend::new(0): {reason}");
        // One clear sentence: no GPU, which runtime file, what to check.
        assert!(reason.contains("found no AMD GPU"), "{reason}");
        assert!(
            reason.contains(&file),
            "the error does not name {file}: {reason}"
        );
        assert!(reason.contains("hipErrorNoDevice"), "{reason}");
        // The copy loaded above, found among the loaded objects.
        assert!(reason.contains("(already loaded)"), "{reason}");
        assert_eq!(
            reason.matches(". ").count(),
            0,
            "more than one sentence: {reason}"
        );
        match probe() {
            Err(Error::Unavailable { reason: r, .. }) => assert_eq!(r, reason),
            other => panic!("probe(): {other:?}"),
        }
        // Repeated attempts reuse the one loaded runtime: no growth.
        for _ in 0..200 {
            let _ = HipBackend::new(0);
        }
        let before = rss();
        for _ in 0..2000 {
            let _ = HipBackend::new(0);
        }
        let grown = rss().saturating_sub(before);
        assert!(
            grown < 1 << 20,
            "2000 failed HipBackend::new(0) grew RSS by {grown} B"
        );
        return;
    }
    let Some(run) = sid_run("real_runtime_symbols_and_no_device") else {
        return;
    };
    let text = run_child(&run, "real_runtime_symbols_and_no_device", "1");
    print!("{text}");
}

#[test]
fn info_reports_no_amd_gpu_through_the_real_runtime() {
    let Some(run) = sid_run("info_reports_no_amd_gpu_through_the_real_runtime") else {
        return;
    };
    let out = Command::new(&run)
        .arg(env!("CARGO_BIN_EXE_dsv4-kvcache"))
        .arg("info")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("ROCM_PATH")
        .output()
        .expect("running dsv4-kvcache info under sid's loader");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "dsv4-kvcache info failed ({}):\n{text}",
        out.status
    );
    let hip = text
        .lines()
        .find(|l| l.trim_start().starts_with("HIP:"))
        .unwrap_or_else(|| panic!("no HIP line in info:\n{text}"));
    println!("{hip}");
    assert!(hip.contains("found no AMD GPU"), "{hip}");
    assert!(
        hip.contains(&runtime_file()),
        "info does not name the runtime file: {hip}"
    );
}

/// As ROCm torch does: a copy of the runtime loaded from its own folder
/// (here `.../torch/lib/libamdhip64.so.6`) before the backend starts, while
/// the search path has another. The backend uses the loaded copy, names it,
/// and never maps the other.
#[test]
fn preloaded_copy_from_an_unusual_path_is_used() {
    if let Some(copy) = std::env::var_os(CHILD) {
        let copy = PathBuf::from(copy);
        // SAFETY: the HIP runtime's initializers only.
        let _torch = unsafe { libloading::Library::new(&copy) }
            .unwrap_or_else(|e| panic!("{} does not load: {e}", copy.display()));
        let reason = match HipBackend::new(0) {
            Err(Error::Unavailable { reason, .. }) => reason,
            Err(e) => panic!("HipBackend::new(0): unexpected error kind: {e}"),
            Ok(_) => panic!("HipBackend::new(0) opened a device without an AMD GPU"),
        };
        println!("HipBackend::new(0): {reason}");
        // As the backend and /proc name it: links resolved.
        let copy = std::fs::canonicalize(&copy)
            .expect("the copy")
            .display()
            .to_string();
        assert!(
            reason.contains(&format!("{copy} (already loaded)")),
            "the backend did not use {copy}: {reason}"
        );
        let hip = maps::mapped_files(&["libamdhip64"]);
        assert_eq!(hip, vec![copy], "more than one HIP runtime is mapped");
        return;
    }
    let Some(run) = sid_run("preloaded_copy_from_an_unusual_path_is_used") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!(
        "dsv4-rocm-preload-{}/site-packages/torch/lib",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join("libamdhip64.so.6");
    std::fs::copy(runtime_file(), &copy).expect("copying the runtime");
    let text = run_child(
        &run,
        "preloaded_copy_from_an_unusual_path_is_used",
        &copy.to_string_lossy(),
    );
    let _ = std::fs::remove_dir_all(dir.ancestors().nth(3).expect("temp root"));
    print!("{text}");
}
