//! `bench`: time per launch, bandwidth ([`traffic`]) against the SM copy
//! roofline (the copy engine's rate beside it, for information) and the
//! seed's H200 anchors ([`anchors`]), fused against separate launches, and
//! the host cost of a launch.

mod anchors;
mod indexer_k;
mod traffic;

use crate::args::Opts;
use crate::select::{with_backend, Job};
use crate::timing::{median_f32, Timing};
use crate::{CliError, CliResult};
use anchors::{anchor, ANCHOR_T};
use dsv4_kvcache::layout::{RecordLayout, RecordOrder};
use dsv4_kvcache::testkit::{make_case, make_gather_case, make_written_gather_case, CaseSpec};
use dsv4_kvcache::vectors::{Op, VTensor, VectorFile};
use dsv4_kvcache::{
    Backend, CompressArgs, Error, InsertArgs, Result, Tensor, TensorDesc, TensorMut,
};
use traffic::traffic;

/// `dsv4-kvcache bench [--backend B] [--tokens ...] [--only ...] [--out FILE]
/// [--copy-mib N] [--slots random|sorted]`.
pub(crate) fn bench_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "backend", "tokens", "out", "launches", "replays", "only", "copy-mib", "slots",
        ],
        &[],
    )?;
    o.no_positional()?;
    let tokens = match o.get("tokens") {
        None => None,
        Some(s) => Some(
            s.split(',')
                .map(|x| x.trim().parse::<usize>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()
                .filter(|v| !v.is_empty() && v.iter().all(|&t| t >= 1))
                .ok_or_else(|| {
                    CliError::Usage(format!("--tokens {s:?}, expected a list like 1,16,128"))
                })?,
        ),
    };
    let only = o.get("only").map(|s| {
        s.split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect::<Vec<_>>()
    });
    if only.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(CliError::Usage(
            "--only needs at least one name, like insert,fused".into(),
        ));
    }
    let sorted_slots = match o.get("slots") {
        None | Some("random") => false,
        Some("sorted") => true,
        Some(x) => {
            return Err(CliError::Usage(format!(
                "--slots {x:?}, expected random or sorted"
            )))
        }
    };
    let copy_mib = o.get("copy-mib").map(|x| x.trim().parse::<usize>());
    let copy_mib = match copy_mib {
        None => None,
        Some(Ok(n)) if n >= 1 => Some(n),
        Some(_) => {
            return Err(CliError::Usage(
                "--copy-mib must be a whole number of MiB, at least 1".into(),
            ))
        }
    };
    let job = BenchJob {
        sorted_slots,
        copy_mib,
        tokens,
        only,
        out: o.get("out").map(str::to_string),
        launches: o.num("launches", 20)?,
        replays: o.num("replays", 7)?,
    };
    if job.launches == 0 || job.replays == 0 {
        return Err(CliError::Usage(
            "--launches and --replays must be at least 1".into(),
        ));
    }
    with_backend(o.backend()?, job)?;
    Ok(())
}

/// The bench's options.
struct BenchJob {
    /// Cache slots in token order instead of a random permutation (to show
    /// what the scattered record stores cost).
    sorted_slots: bool,
    /// The roofline copy's size (default 1 GiB on GPUs, 256 MiB on the CPU).
    copy_mib: Option<usize>,
    tokens: Option<Vec<usize>>,
    /// Run only the rows whose label contains one of these.
    only: Option<Vec<String>>,
    out: Option<String>,
    launches: usize,
    replays: usize,
}

impl BenchJob {
    /// Whether the row labelled `label` runs (`--only`).
    fn wants(&self, label: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|v| v.iter().any(|x| label.contains(x.as_str())))
    }
}

/// One case of the table.
struct BenchCase {
    name: String,
    layout: Option<RecordLayout>,
    spec: CaseSpec,
    /// Gathers: a cache of random bytes instead of one the writer filled.
    random_bytes: bool,
}

/// The rows of the main table at `t` tokens.
fn bench_cases(t: usize) -> Vec<BenchCase> {
    let mut v = Vec::new();
    let base = CaseSpec {
        tokens: t,
        seed: 0xbe4c + t as u64,
        ring_capacity: 2,
        ..Default::default()
    };
    for l in [
        RecordLayout::Mxfp8,
        RecordLayout::Nvfp4,
        RecordLayout::V4,
        RecordLayout::Bf16Rows,
        RecordLayout::Fp8Rows,
    ] {
        v.push(BenchCase {
            name: format!("insert {}", l.name()),
            layout: Some(l),
            spec: CaseSpec {
                op: Op::RopeQuantInsert,
                layout: l,
                ..base.clone()
            },
            random_bytes: false,
        });
    }
    // The V4.1 records in vLLM 0.34.0's per-token order: the same bytes per
    // record, stored whole instead of split across the page.
    for l in [RecordLayout::Mxfp8, RecordLayout::Nvfp4] {
        v.push(BenchCase {
            name: format!("insert {} per_token", l.name()),
            layout: Some(l),
            spec: CaseSpec {
                op: Op::RopeQuantInsert,
                layout: l,
                record_order: RecordOrder::PerToken,
                ..base.clone()
            },
            random_bytes: false,
        });
    }
    v.push(BenchCase {
        name: "compress CR1".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            ..base.clone()
        },
        random_bytes: false,
    });
    v.push(BenchCase {
        name: "compress CR2, T one-token requests".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: t,
            ..base.clone()
        },
        random_bytes: false,
    });
    // Decode with one speculative (MTP) token: the second token of each
    // request closes the group (pooled by its request item in the
    // multi-token kernels, launch::Cr2Shape::multi_token).
    v.push(BenchCase {
        name: "compress CR2, T/2 two-token requests".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: (t / 2).max(1),
            ..base.clone()
        },
        random_bytes: false,
    });
    v.push(BenchCase {
        name: "compress CR2, 4 requests of T/4".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: 4,
            ..base.clone()
        },
        random_bytes: false,
    });
    v.push(BenchCase {
        name: "save_ring_rows".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::SaveRingRows,
            ..base.clone()
        },
        random_bytes: false,
    });
    // The reader: T rows gathered by a random permutation of slots from a
    // cache of 2T rows, dequantized to BF16; the cache as the writer fills
    // it, then random bytes (every decoder path, NaN codes included).
    for random in [false, true] {
        for l in RecordLayout::ALL {
            v.push(BenchCase {
                name: format!(
                    "gather {}{}",
                    l.name(),
                    if random { ", random bytes" } else { "" }
                ),
                layout: Some(l),
                spec: CaseSpec {
                    op: Op::GatherDequant,
                    layout: l,
                    requests: 0,
                    ..base.clone()
                },
                random_bytes: random,
            });
        }
    }
    for l in [RecordLayout::Mxfp8, RecordLayout::Nvfp4] {
        v.push(BenchCase {
            name: format!("gather {} per_token", l.name()),
            layout: Some(l),
            spec: CaseSpec {
                op: Op::GatherDequant,
                layout: l,
                record_order: RecordOrder::PerToken,
                requests: 0,
                ..base.clone()
            },
            random_bytes: false,
        });
    }
    v
}

impl Job for BenchJob {
    type Out = ();

    fn run<B: Backend, T: Timing<B>>(self, b: &mut B, timing: &T, notes: &[String]) -> Result<()> {
        let cpu = timing.is_reference();
        let tokens = self.tokens.clone().unwrap_or_else(|| {
            if cpu {
                vec![1, 16, 128, 1024, 8192]
            } else {
                ANCHOR_T.to_vec()
            }
        });
        b.set_sanitize(false);
        notes.iter().for_each(|n| println!("{n}"));
        println!(
            "dsv4-kvcache {} bench on {}",
            env!("CARGO_PKG_VERSION"),
            b.name()
        );
        println!(
            "timing: {}; {} launches per replay, {} replays",
            timing.method(),
            self.launches,
            self.replays
        );
        // Several times the L2 (50 MiB on an H200, 256 MiB of Infinity
        // Cache on an MI300X), so that the copy runs from memory.
        let copy_bytes = self.copy_mib.unwrap_or(if cpu { 256 } else { 1024 }) << 20;
        let (roof, roof_how) =
            timing.roofline(b, copy_bytes, self.launches.min(10), self.replays)?;
        let engine = timing.copy_rate(b, copy_bytes, self.replays)?;
        println!(
            "roofline: copy of {} MiB ({roof_how}), bytes read + written: {:.1} GB/s",
            copy_bytes >> 20,
            roof / 1e9
        );
        println!(
            "copy engine ({} MiB device-to-device copy, for information): {:.1} GB/s",
            copy_bytes >> 20,
            engine / 1e9
        );
        println!(
            "bytes per launch: every tensor the work reads or writes, once (bench/traffic.rs); cache slots {}",
            if self.sorted_slots { "sorted (token order)" } else { "a random permutation" }
        );
        println!();
        println!(
            "| op | T | µs/launch | GB/s | % of roofline | seed on H200, µs | speedup vs seed |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        let mut rows = Vec::new();
        for &t in &tokens {
            for c in bench_cases(t) {
                if !self.wants(&c.name) {
                    continue;
                }
                let mut f = if c.spec.op != Op::GatherDequant {
                    make_case(&c.spec)
                } else if c.random_bytes {
                    make_gather_case(&c.spec, false)
                } else {
                    make_written_gather_case(&c.spec, false)
                };
                if self.sorted_slots {
                    sort_slots(&mut f)?;
                }
                let bytes = traffic(&f, c.layout)?;
                let mut p = f.prepare(b)?;
                let us =
                    median_f32(
                        &timing
                            .per_launch_us(b, self.launches, self.replays, &mut |b| p.launch(b))?,
                    ) as f64;
                drop(p);
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                let anchor = anchor(&c.name, t);
                println!(
                    "| {} | {} | {:.2} | {:.1} | {:.1} % | {} | {} |",
                    c.name,
                    t,
                    us,
                    gbps,
                    100.0 * gbps * 1e9 / roof,
                    anchor.map_or("—".into(), |a| format!("{a:.2}")),
                    anchor.map_or("—".into(), |a| format!("{:.2}×", a / us))
                );
                rows.push(serde_json::json!({
                    "op": c.name, "tokens": t, "us_per_launch": us, "bytes": bytes, "gb_per_s": gbps,
                    "fraction_of_roofline": gbps * 1e9 / roof, "anchor_us": anchor,
                    "speedup_vs_anchor": anchor.map(|a| a / us),
                }));
            }
            for (name, format, order) in indexer_k::ROWS {
                if !self.wants(name) {
                    continue;
                }
                let us = indexer_k::time(b, timing, t, format, order, self.launches, self.replays)?;
                let bytes = indexer_k::bytes(t, format);
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                println!(
                    "| {name} | {t} | {us:.2} | {gbps:.1} | {:.1} % | — | — |",
                    100.0 * gbps * 1e9 / roof
                );
                rows.push(serde_json::json!({
                    "op": name, "tokens": t, "us_per_launch": us, "bytes": bytes, "gb_per_s": gbps,
                    "fraction_of_roofline": gbps * 1e9 / roof, "anchor_us": null,
                    "speedup_vs_anchor": null,
                }));
            }
        }

        // Fused compress + insert vs the two calls: at decode sizes (CR2 as
        // one-token requests, and from 16 tokens as two-token requests, i.e.
        // speculative decode), then at the prefill sizes asked for (1024
        // tokens and up), where CR2 also runs as a few long requests, on the
        // fused lone-group kernels above 2560 items.
        println!();
        println!("fused compress + insert vs the two separate calls:");
        println!("| case | layout | T | fused µs | compress + insert µs | fused saves |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        let mut fused_rows = Vec::new();
        let fused_sizes: Vec<usize> = [1usize, 16, 128]
            .into_iter()
            .chain(tokens.iter().copied().filter(|&t| t >= 1024))
            .collect();
        for t in fused_sizes {
            let mut cases = vec![("CR1", 1u32, 1usize), ("CR2, T one-token requests", 2, t)];
            if t >= 16 {
                cases.push(("CR2, T/2 two-token requests", 2, t / 2));
            }
            if t >= 1024 {
                cases.push(("CR2, 4 requests of T/4", 2, 4));
            }
            for (case, cr, requests) in cases {
                for l in RecordLayout::ALL {
                    if !self.wants(&format!("fused {case} {}", l.name())) {
                        continue;
                    }
                    let spec = CaseSpec {
                        op: Op::FusedCompressInsert,
                        layout: l,
                        compress_ratio: cr,
                        tokens: t,
                        requests,
                        ring_capacity: 2,
                        seed: 0xf05e + t as u64,
                        ..Default::default()
                    };
                    let f = make_case(&spec);
                    let mut p = f.prepare(b)?;
                    let fused = median_f32(&timing.per_launch_us(
                        b,
                        self.launches,
                        self.replays,
                        &mut |b| p.launch(b),
                    )?) as f64;
                    drop(p);
                    let sep = separate_us(b, timing, &f, self.launches, self.replays)?;
                    println!(
                        "| {case} | {} | {t} | {fused:.2} | {sep:.2} | {:.1} % |",
                        l.name(),
                        100.0 * (1.0 - fused / sep)
                    );
                    fused_rows.push(serde_json::json!({
                        "case": case, "layout": l.name(), "tokens": t, "fused_us": fused, "separate_us": sep,
                    }));
                }
            }
        }

        // Host cost of a launch from Rust.
        println!();
        println!("host cost of one eager launch (wall time of N launches / N, no wait between):");
        let mut host_rows = Vec::new();
        for (name, spec) in [
            (
                "insert mxfp8, T = 1",
                CaseSpec {
                    op: Op::RopeQuantInsert,
                    tokens: 1,
                    ..Default::default()
                },
            ),
            (
                "compress CR1, T = 1",
                CaseSpec {
                    op: Op::FusedSaveCompressNorm,
                    tokens: 1,
                    ..Default::default()
                },
            ),
            (
                "fused CR1 mxfp8, T = 1",
                CaseSpec {
                    op: Op::FusedCompressInsert,
                    tokens: 1,
                    ..Default::default()
                },
            ),
        ] {
            if !self.wants(&format!("host {name}")) {
                continue;
            }
            let f = make_case(&spec);
            let mut p = f.prepare(b)?;
            let calls = 2000;
            let us = timing.host_launch_us(b, calls, &mut |b| p.launch(b))?;
            println!("  {name}: {us:.2} µs (N = {calls})");
            host_rows.push(serde_json::json!({"op": name, "us": us, "calls": calls}));
        }

        if let Some(path) = &self.out {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let doc = serde_json::json!({
                "crate_version": env!("CARGO_PKG_VERSION"),
                "backend": b.name(),
                "timing": timing.method(),
                "launches_per_replay": self.launches,
                "replays": self.replays,
                "unix_time": now,
                "copy_bytes": copy_bytes,
                "roofline_bytes_per_s": roof,
                "roofline": roof_how,
                "copy_engine_bytes_per_s": engine,
                "sorted_slots": self.sorted_slots,
                "anchors": "the seed's Triton kernels on an H200 (2026-11-30), CUDA-graph replay: bench/anchors.rs",
                "rows": rows,
                "fused": fused_rows,
                "host_launch": host_rows,
            });
            let text =
                serde_json::to_string_pretty(&doc).map_err(|e| Error::Vectors(e.to_string()))?;
            std::fs::write(path, text).map_err(|e| Error::Vectors(format!("{path}: {e}")))?;
            println!("\nwrote {path}");
        }
        Ok(())
    }
}

/// Rewrites an insert case's cache slots in token order (the same slots,
/// sorted, skipped tokens kept), so that consecutive tokens' records are
/// adjacent: the bench's measure of what scattered stores cost.
fn sort_slots(f: &mut VectorFile) -> Result<()> {
    if f.op()? != Op::RopeQuantInsert {
        return Ok(());
    }
    let key = "in.slot_mapping";
    let t = f
        .tensors
        .get(key)
        .ok_or_else(|| Error::Vectors(format!("insert case without {key}")))?;
    let v = t.to_i64()?;
    let mut valid: Vec<i64> = v.iter().copied().filter(|s| *s >= 0).collect();
    valid.sort_unstable();
    let mut it = valid.into_iter();
    let sorted: Vec<i64> = v
        .iter()
        .map(|s| if *s >= 0 { it.next().unwrap_or(*s) } else { *s })
        .collect();
    let shape = t.shape.clone();
    f.tensors.insert(key.into(), VTensor::i64(&shape, &sorted));
    Ok(())
}

/// Time of `fused_save_compress_norm` then `rope_quant_insert` as two
/// launches, on the inputs of a fused case.
fn separate_us<B: Backend, T: Timing<B>>(
    b: &B,
    timing: &T,
    f: &VectorFile,
    launches: usize,
    replays: usize,
) -> Result<f64> {
    let up = |name: &str| -> Result<Option<(B::Buffer, TensorDesc)>> {
        match f.input(name) {
            None => Ok(None),
            Some(t) => Ok(Some((b.upload(&t.data)?, t.desc()?))),
        }
    };
    let need = |x: Option<(B::Buffer, TensorDesc)>, name: &str| {
        x.ok_or_else(|| Error::Vectors(format!("fused case without in.{name}")))
    };
    let kv = need(up("kv_score")?, "kv_score")?;
    let pos = need(up("positions")?, "positions")?;
    let slots = need(up("slot_mapping")?, "slot_mapping")?;
    let weight = need(up("rms_norm_weight")?, "rms_norm_weight")?;
    let mut latent = need(up("latent_out")?, "latent_out")?;
    let cos = need(up("cos_sin")?, "cos_sin")?;
    let mut cache = need(up("kv_cache")?, "kv_cache")?;
    let cslots = need(up("cache_slot_mapping")?, "cache_slot_mapping")?;
    let mut ring = up("state_cache")?;
    let qsl = up("query_start_loc")?;
    let ttr = up("token_to_req_indices")?;
    let fp8 = up("fp8_scale")?;
    let eps = f.rms_norm_eps()?;
    let record_order = f.record_order()?;
    let cr = f.compress_ratio()?;
    fn t<S>(x: &(S, TensorDesc)) -> Tensor<'_, S> {
        Tensor::new(&x.0, x.1)
    }
    let mut both = |b: &B| -> Result<()> {
        b.fused_save_compress_norm(CompressArgs {
            kv_score: t(&kv),
            positions: t(&pos),
            state_cache: ring.as_mut().map(|x| TensorMut::new(&mut x.0, x.1)),
            slot_mapping: t(&slots),
            query_start_loc: qsl.as_ref().map(t),
            token_to_req_indices: ttr.as_ref().map(t),
            rms_norm_weight: t(&weight),
            rms_norm_eps: eps,
            compress_ratio: cr,
            latent_out: TensorMut::new(&mut latent.0, latent.1),
            prev_rows: None,
            prev_row_indices: None,
        })?;
        b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(&latent.0, latent.1),
            positions: t(&pos),
            cos_sin_cache: t(&cos),
            kv_cache: TensorMut::new(&mut cache.0, cache.1),
            slot_mapping: t(&cslots),
            compress_ratio: cr,
            fp8_scale: fp8.as_ref().map(t),
            record_order,
        })
    };
    Ok(median_f32(&timing.per_launch_us(b, launches, replays, &mut both)?) as f64)
}
