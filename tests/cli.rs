//! The command-line tool as a user runs it: exit codes and what `bench
//! --only` keeps. On the CPU backend, so it runs everywhere.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dsv4-kvcache"))
        .args(args)
        .output()
        .expect("the binary runs");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn bench_only_keeps_the_named_rows() {
    let (code, text) = run(&[
        "bench",
        "--backend",
        "cpu",
        "--tokens",
        "1",
        "--launches",
        "1",
        "--replays",
        "1",
        "--only",
        "insert nvfp4,host",
    ]);
    assert_eq!(code, 0, "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| ")).collect();
    // The header and the insert rows of the main table (the page-planar
    // and the per-token order), and the fused table's header only.
    let data: Vec<&&str> = rows
        .iter()
        .filter(|l| !l.starts_with("| op") && !l.starts_with("| case") && !l.starts_with("| ---"))
        .collect();
    assert_eq!(data.len(), 2, "{text}");
    assert!(data[0].starts_with("| insert nvfp4 | 1 |"), "{text}");
    assert!(
        data[1].starts_with("| insert nvfp4 per_token | 1 |"),
        "{text}"
    );
    let host: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("µs (N ="))
        .collect();
    assert_eq!(host.len(), 3, "{text}");
}

#[test]
fn bench_only_without_names_is_a_usage_error() {
    let (code, text) = run(&["bench", "--backend", "cpu", "--only", " , "]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--only"), "{text}");
}

#[test]
fn soak_on_the_cpu_compares_every_step() {
    // The one-thread reference checked as a device against the
    // multi-threaded one: every step's outputs compared, no mismatch.
    let (code, out) = run(&[
        "soak",
        "--backend",
        "cpu1",
        "--steps",
        "60",
        "--slots",
        "6",
        "--max-prompt",
        "160",
        "--max-decode",
        "24",
    ]);
    assert_eq!(code, 0, "{out}");
    let summary = out
        .lines()
        .find(|l| l.starts_with("soak summary: 60 steps"))
        .unwrap_or_else(|| panic!("no summary in {out}"));
    assert!(summary.ends_with(", 0 mismatches"), "{summary}");
    // Requests came and went, and bytes were compared.
    let num = |after: &str| -> u64 {
        let i = summary
            .find(after)
            .unwrap_or_else(|| panic!("{after} in {summary}"));
        summary[..i]
            .split([' ', '('])
            .rfind(|w| !w.is_empty())
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    assert!(num(" finished)") >= 2, "{summary}");
    assert!(num(" bytes compared") > 1 << 20, "{summary}");
    assert!(out.contains("memory: device"), "{out}");
}

#[test]
fn soak_rejects_bad_options() {
    for args in [
        &["soak", "--slots", "0"][..],
        &["soak", "--duration", "-1"],
        &["soak", "--max-prompt", "1"],
        &["soak", "--steps", "x"],
    ] {
        let (code, out) = run(args);
        assert_eq!(code, 2, "{args:?}: {out}");
    }
}

#[test]
fn capture_and_verify_in_the_per_token_order() {
    // A per-token vector file written by the reference replays on the CPU
    // backend byte for byte, and says its order in its metadata.
    let dir = std::env::temp_dir().join(format!("dsv4-order-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (op, layout) in [
        ("rope_quant_insert", "mxfp8"),
        ("fused_compress_insert", "nvfp4"),
        ("gather_dequant", "nvfp4"),
    ] {
        let path = dir.join(format!("{op}-{layout}.safetensors"));
        let path = path.to_str().expect("utf-8 path");
        // The reader's cache holds records the writer made (--written).
        let written: &[&str] = if op == "gather_dequant" {
            &["--written"]
        } else {
            &[]
        };
        let (code, text) = run(&[
            &[
                "capture",
                "--op",
                op,
                "--layout",
                layout,
                "--cr",
                "2",
                "--tokens",
                "40",
                "--record-order",
                "per_token",
                "--out",
                path,
            ],
            written,
        ]
        .concat());
        assert_eq!(code, 0, "{text}");
        let f = dsv4_kvcache::vectors::VectorFile::load(path).expect("the file loads");
        assert_eq!(
            f.record_order().expect("valid metadata"),
            dsv4_kvcache::RecordOrder::PerToken
        );
        let (code, text) = run(&["verify", path, "--backend", "cpu"]);
        assert_eq!(code, 0, "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_record_order_is_a_usage_error() {
    for cmd in [
        &["demo"][..],
        &["soak"],
        &[
            "capture",
            "--op",
            "rope_quant_insert",
            "--out",
            "unused.safetensors",
        ],
    ] {
        let cmd = [cmd, &["--record-order", "tokenwise"]].concat();
        let (code, text) = run(&cmd);
        assert_eq!(code, 2, "{cmd:?}: {text}");
        assert!(
            text.contains("--record-order \"tokenwise\""),
            "{cmd:?}: {text}"
        );
    }
}

#[test]
fn demo_and_soak_run_in_the_per_token_order() {
    // The V4.1 caches per token, the V4 one page-planar (its only order),
    // checked byte for byte against the reference as in the default order.
    let (code, out) = run(&[
        "soak",
        "--backend",
        "cpu1",
        "--steps",
        "20",
        "--slots",
        "4",
        "--max-prompt",
        "90",
        "--max-decode",
        "12",
        "--record-order",
        "per_token",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("soak summary: 20 steps") && l.ends_with(", 0 mismatches")),
        "{out}"
    );
    let (code, out) = run(&[
        "demo",
        "--backend",
        "cpu",
        "--requests",
        "2",
        "--prefill-tokens",
        "40",
        "--decode-steps",
        "4",
        "--record-order",
        "per_token",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("PASS"), "{out}");
}
