//! The gather kernels' source (`kernels-hip/kv_gather.hip` and `kv_gather.h`,
//! through `kvcache.hip`) compiled for the host and run against the CPU reference,
//! byte for byte, on the cases of `tests/gather_device.rs`: it checks the
//! kernels' addressing, their shortcuts and their packing wherever no GPU
//! is at hand. The kernels never talk across lanes, so running the grid's
//! work-items one after the other (`tests/host_kernels/gather_host.cpp`) is
//! exact; what it cannot check (the device compilers, the hardware) the
//! device parity tests do.
//!
//! Needs a host C++17 compiler (`$CXX`, else `c++`); without one it prints
//! SKIPPED.

mod gather_cases;
#[path = "host_kernels/mod.rs"]
mod host_kernels;

use dsv4_kvcache::gather::{
    gather_launch, gather_launch_kernel, gather_params, plan_gather, GatherPtrs,
};
use dsv4_kvcache::ops::SkipCounts;
use dsv4_kvcache::{CpuBackend, DType, GatherArgs, GatherIndex, RecordLayout, Tensor, TensorDesc};
use dsv4_kvcache::{LaunchPolicy, TensorMut};
use gather_cases::{layout_sweep, random_case, Case, Form};
use std::path::PathBuf;

fn index_bytes(v: &[i64], i64: bool) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| {
            if i64 {
                x.to_le_bytes().to_vec()
            } else {
                (x as i32).to_le_bytes().to_vec()
            }
        })
        .collect()
}

/// Runs `case` through the host-built kernels with the launch a GPU
/// backend with `policy` would pick.
fn run_host(
    exe: &PathBuf,
    case: &Case,
    policy: &LaunchPolicy,
) -> (Vec<u8>, SkipCounts, Option<&'static str>) {
    let fp8 = case.fp8_scale.unwrap_or(1.0).to_le_bytes().to_vec();
    let mut out = case.canary_out();
    let (slots, table, cu, starts, i64) = match &case.form {
        Form::Slots { slots, i64 } => (index_bytes(slots, *i64), vec![], vec![], vec![], *i64),
        Form::Table {
            table,
            cu,
            starts,
            i64,
            ..
        } => (
            vec![],
            index_bytes(table, *i64),
            index_bytes(cu, *i64),
            starts.as_ref().map_or(vec![], |s| index_bytes(s, *i64)),
            *i64,
        ),
    };
    let it = |n: usize| TensorDesc::contiguous(if i64 { DType::I64 } else { DType::I32 }, &[n]);
    let esz = if i64 { 8 } else { 4 };
    let plan = {
        let index = match &case.form {
            Form::Slots { .. } => GatherIndex::Slots {
                slot_mapping: Tensor::new(&slots, it(slots.len() / esz)),
            },
            Form::Table {
                rows,
                cols,
                row_stride,
                starts: st,
                ..
            } => GatherIndex::BlockTable {
                block_table: Tensor::new(
                    &table,
                    TensorDesc::strided(
                        if i64 { DType::I64 } else { DType::I32 },
                        &[*rows, *cols],
                        &[*row_stride, 1],
                    )
                    .unwrap(),
                ),
                cu_seq_lens: Tensor::new(&cu, it(cu.len() / esz)),
                seq_starts: st
                    .as_ref()
                    .map(|_| Tensor::new(&starts, it(starts.len() / esz))),
            },
        };
        plan_gather(&GatherArgs {
            kv_cache: Tensor::new(&case.cache, case.cache_desc),
            index,
            fp8_scale: case
                .fp8_scale
                .map(|_| Tensor::new(&fp8, TensorDesc::contiguous(DType::F32, &[1]))),
            out: TensorMut::new(&mut out, case.out_desc()),
            record_order: case.order,
        })
        .expect("the case is valid")
    };
    let Some(launch) = gather_launch(policy, plan.cache.layout, plan.n, plan.slot_kernels()) else {
        return (out, SkipCounts::default(), None);
    };
    let (bufs, ptrs) = host_kernels::bind!(GatherPtrs {
        cache: &case.cache,
        slots: &slots,
        block_table: &table,
        cu_seq_lens: &cu,
        seq_starts: &starts,
        fp8_scale: &fp8,
        out: &out,
    });
    let params = gather_params(&plan, &ptrs, &launch);
    let kernel = gather_launch_kernel(&plan, &launch);
    let mut run = host_kernels::run(
        exe,
        &bufs,
        &params,
        kernel.name(),
        &launch.geometry,
        &case.label,
    );
    (run.bufs.swap_remove(6), run.counts, Some(kernel.name()))
}

/// Every layout's gathers through the host-built kernels `exe` under each
/// row mapping, against the CPU reference; removes `exe`.
fn check_against_reference(exe: PathBuf) {
    let cpu = CpuBackend::new();
    let mut cases = Vec::new();
    let mut seed = 0u64;
    for layout in RecordLayout::ALL {
        // Both sides of the split's end, the layout's own, are in the sweep.
        cases.extend(layout_sweep(
            layout,
            &[1, 7, 64, 65, 130, 1500],
            24,
            &mut seed,
        ));
        seed += 1;
        cases.push(random_case(seed, layout, false, 9001, true));
    }
    // Every row mapping at every size: as measured, then each forced.
    let m = LaunchPolicy::default();
    let policies = [
        ("as measured", m),
        (
            "two rows a group",
            LaunchPolicy {
                gather_two_rows: Some(true),
                ..m
            },
        ),
        (
            "a row a group",
            LaunchPolicy {
                gather_split_rows: Some(false),
                ..m
            },
        ),
        (
            "a row over two groups",
            LaunchPolicy {
                gather_split_rows: Some(true),
                ..m
            },
        ),
    ];
    let mut bad = 0;
    let mut ran = std::collections::BTreeSet::new();
    for case in &cases {
        let want = case.run(&cpu).unwrap();
        for (shape, policy) in &policies {
            let (out, counts, kernel) = run_host(&exe, case, policy);
            ran.extend(kernel);
            if out != want.out || counts != want.counts {
                let i = out.iter().zip(&want.out).position(|(a, b)| a != b);
                eprintln!(
                    "MISMATCH {} ({shape}): first byte {i:?}, counts {counts:?} want {:?}",
                    case.label, want.counts
                );
                bad += 1;
            }
        }
    }
    let _ = std::fs::remove_file(&exe);
    assert_eq!(
        bad,
        0,
        "{bad} of {} runs differ",
        policies.len() * cases.len()
    );
}

#[test]
fn host_built_kernels_match_the_reference() {
    match host_kernels::build("gather_host.cpp", &[]) {
        Ok(exe) => check_against_reference(exe),
        Err(why) => host_kernels::skipped(&format!("gather host kernels: {why}")),
    }
}

/// The gathers as sm_90 builds them: the prelude's BF16 pair conversion and
/// multiplication, built on the host from their Rust twins' definitions
/// (`KV_HOST_BF16X2_ARITH`, tests/host_kernels/prelude_host.h).
#[test]
fn host_built_kernels_on_bf16_pairs_match_the_reference() {
    match host_kernels::build("gather_host.cpp", &["KV_HOST_BF16X2_ARITH"]) {
        Ok(exe) => check_against_reference(exe),
        Err(why) => host_kernels::skipped(&format!("gather host kernels: {why}")),
    }
}
