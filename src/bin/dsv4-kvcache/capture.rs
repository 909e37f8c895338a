//! `capture`: writes a test-vector file whose outputs come from the CPU reference.

use crate::args::{record_order_opt, Opts};
use crate::verify::describe_file;
use crate::{CliError, CliResult};
use dsv4_kvcache::layout::RecordLayout;
use dsv4_kvcache::testkit::{make_case, make_gather_case, make_written_gather_case, CaseSpec};
use dsv4_kvcache::vectors::Op;

/// `dsv4-kvcache capture --op OP ... --out FILE`.
pub(crate) fn capture_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "op",
            "layout",
            "cr",
            "tokens",
            "requests",
            "ring-capacity",
            "seed",
            "out",
            "out-dtype",
            "record-order",
        ],
        &["sanitize", "adversarial", "written"],
    )?;
    o.no_positional()?;
    let op_name = o
        .get("op")
        .ok_or_else(|| CliError::Usage("capture needs --op".into()))?;
    let op = Op::from_name(op_name).ok_or_else(|| {
        CliError::Usage(format!(
            "--op {op_name:?}, expected rope_quant_insert, fused_save_compress_norm, save_ring_rows, fused_compress_insert or gather_dequant"
        ))
    })?;
    let layout_name = o.get("layout").unwrap_or("mxfp8");
    let layout = RecordLayout::from_name(layout_name).ok_or_else(|| {
        CliError::Usage(format!(
            "--layout {layout_name:?}, expected v4, mxfp8, nvfp4, bf16 or fp8"
        ))
    })?;
    let out = o
        .get("out")
        .ok_or_else(|| CliError::Usage("capture needs --out FILE".into()))?;
    let cr: u32 = o.num("cr", 1)?;
    if cr != 1 && cr != 2 {
        return Err(CliError::Usage(format!("--cr {cr}, expected 1 or 2")));
    }
    let spec = CaseSpec {
        op,
        layout,
        record_order: record_order_opt(&o)?,
        compress_ratio: cr,
        tokens: o.num("tokens", 256)?,
        requests: o.num("requests", 4)?,
        ring_capacity: o.num("ring-capacity", 4)?,
        seed: o.num("seed", 1)?,
        sanitize: o.flag("sanitize"),
        adversarial: o.flag("adversarial"),
    };
    if spec.tokens == 0 {
        return Err(CliError::Usage("--tokens must be at least 1".into()));
    }
    let mut f = if op == Op::GatherDequant {
        // --requests 0: the slot form; --out-dtype bf16 (default) or f32.
        let out_f32 = match o.get("out-dtype").unwrap_or("bf16") {
            "bf16" => false,
            "f32" => true,
            d => {
                return Err(CliError::Usage(format!(
                    "--out-dtype {d:?}, expected bf16 or f32"
                )))
            }
        };
        // --written: the cache the bench's "gather L" rows read (every row
        // a record the writer made), instead of random bytes.
        if o.flag("written") {
            make_written_gather_case(&spec, out_f32)
        } else {
            make_gather_case(&spec, out_f32)
        }
    } else if o.flag("written") {
        return Err(CliError::Usage(
            "--written applies to --op gather_dequant only".into(),
        ));
    } else {
        make_case(&spec)
    };
    f.capture_reference()?;
    f.save(out)?;
    println!(
        "wrote {out}: {}, {} tensors",
        describe_file(&f),
        f.tensors.len()
    );
    Ok(())
}
