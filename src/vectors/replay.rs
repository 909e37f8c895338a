//! Replay: a file's inputs uploaded to a backend, launched, and its outputs
//! read back.

use super::format::{Op, VTensor, VectorFile, OUTPUT_NAMES};
use super::report::ReplayReport;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::gather::{GatherArgs, GatherIndex};
use crate::layout::{RecordLayout, RecordOrder};
use crate::ops::{CompressArgs, FusedArgs, InsertArgs, RingArgs, SkipCounts};
use crate::tensor::{DType, Tensor, TensorDesc, TensorMut};
use crate::CpuBackend;
use std::collections::BTreeMap;

/// Every written tensor's bytes by output name, and the skip counts.
pub type Executed = (Vec<(&'static str, Vec<u8>)>, SkipCounts);

impl VectorFile {
    /// Uploads the inputs to `backend`, ready to launch.
    pub fn prepare<'f, B: Backend>(&'f self, backend: &B) -> Result<Prepared<'f, B>> {
        self.check()?;
        let op = self.op()?;
        let layout = if op.has_layout() {
            Some(self.layout()?)
        } else {
            None
        };
        let mut inputs = BTreeMap::new();
        let mut outs: [Option<Buf<B>>; 4] = [None, None, None, None];
        for (name, t) in &self.tensors {
            let Some(arg) = name.strip_prefix("in.") else {
                continue;
            };
            let mut desc = t.desc()?;
            // FP8 rows stored as raw bytes (numpy has no e4m3): read as F8_E4M3.
            if arg == "kv_cache" && layout == Some(RecordLayout::Fp8Rows) && t.dtype == DType::U8 {
                desc = TensorDesc::contiguous(DType::F8E4M3, &t.shape);
            }
            let buf = Buf {
                desc,
                buf: backend.upload(&t.data)?,
            };
            match OUTPUT_NAMES.iter().position(|o| *o == arg) {
                Some(i) => outs[i] = Some(buf),
                None => {
                    inputs.insert(arg.to_string(), buf);
                }
            }
        }
        let [kv_cache, latent_out, state_cache, out] = outs;
        Ok(Prepared {
            file: self,
            op,
            compress_ratio: if op.has_compress_ratio() {
                self.compress_ratio()?
            } else {
                1
            },
            eps: if matches!(op, Op::FusedSaveCompressNorm | Op::FusedCompressInsert) {
                self.rms_norm_eps()?
            } else {
                0.0
            },
            skip_latent_out: self.skip_latent_out()?,
            record_order: self.record_order()?,
            inputs,
            kv_cache,
            latent_out,
            state_cache,
            out,
        })
    }

    /// Runs the op on `backend` (with the file's `sanitize`, restored
    /// afterwards) and returns every written tensor's bytes, by output name,
    /// with the tokens the backend skipped.
    pub fn execute<B: Backend>(&self, backend: &mut B) -> Result<Executed> {
        let sanitize = self.sanitize()?;
        let before = backend.sanitize();
        backend.set_sanitize(sanitize);
        let res = (|| {
            let mut p = self.prepare(backend)?;
            backend.take_skip_counts()?;
            p.launch(backend)?;
            let outs = p.outputs(backend)?;
            let skipped = backend.take_skip_counts()?;
            Ok((outs, skipped))
        })();
        backend.set_sanitize(before);
        res
    }

    /// Replays the file on `backend` and compares every `out.*` tensor with
    /// what the backend wrote, byte for byte.
    pub fn replay<B: Backend>(&self, backend: &mut B) -> Result<ReplayReport> {
        let (outs, skipped) = self.execute(backend)?;
        ReplayReport::compare(self, backend.name(), &outs, skipped)
    }

    /// Runs the op on the CPU reference and stores its results as the
    /// `out.*` tensors (every tensor the op writes), replacing any present.
    pub fn capture_reference(&mut self) -> Result<()> {
        let mut cpu = CpuBackend::new();
        let (outs, _) = self.execute(&mut cpu)?;
        let op = self.op()?;
        for (name, bytes) in outs.into_iter().filter(|(n, _)| op.writes(n)) {
            let input = self.input(name).expect("outputs come from inputs");
            let t = VTensor {
                dtype: input.dtype,
                shape: input.shape.clone(),
                data: bytes,
            };
            self.tensors.insert(format!("out.{name}"), t);
        }
        if !self.meta.contains_key("source") {
            self.meta.insert(
                "source".into(),
                format!("dsv4-kvcache {} CPU reference", env!("CARGO_PKG_VERSION")),
            );
        }
        Ok(())
    }
}

// ---- running a file -------------------------------------------------------------

/// A backend buffer with the view of its tensor.
pub struct Buf<B: Backend> {
    /// The tensor's view.
    pub desc: TensorDesc,
    /// The backend's copy of its bytes.
    pub buf: B::Buffer,
}

/// A vector file's inputs uploaded to a backend: launch it as often as you
/// like (benchmarks), [`Prepared::reset`] the written tensors, read them.
pub struct Prepared<'f, B: Backend> {
    file: &'f VectorFile,
    op: Op,
    compress_ratio: u32,
    eps: f32,
    skip_latent_out: bool,
    record_order: RecordOrder,
    inputs: BTreeMap<String, Buf<B>>,
    kv_cache: Option<Buf<B>>,
    latent_out: Option<Buf<B>>,
    state_cache: Option<Buf<B>>,
    out: Option<Buf<B>>,
}

fn ro<'a, B: Backend>(
    inputs: &'a BTreeMap<String, Buf<B>>,
    name: &str,
) -> Result<Tensor<'a, B::Buffer>> {
    inputs
        .get(name)
        .map(|b| Tensor::new(&b.buf, b.desc))
        .ok_or_else(|| Error::Vectors(format!("no in.{name}")))
}

fn opt<'a, B: Backend>(
    inputs: &'a BTreeMap<String, Buf<B>>,
    name: &str,
) -> Option<Tensor<'a, B::Buffer>> {
    inputs.get(name).map(|b| Tensor::new(&b.buf, b.desc))
}

fn rw<'a, B: Backend>(b: &'a mut Option<Buf<B>>, name: &str) -> Result<TensorMut<'a, B::Buffer>> {
    b.as_mut()
        .map(|b| TensorMut::new(&mut b.buf, b.desc))
        .ok_or_else(|| Error::Vectors(format!("no in.{name}")))
}

impl<B: Backend> Prepared<'_, B> {
    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Launches the op once on the uploaded buffers (the written tensors
    /// keep what earlier launches wrote).
    pub fn launch(&mut self, backend: &B) -> Result<()> {
        let Prepared {
            op,
            compress_ratio,
            eps,
            skip_latent_out,
            record_order,
            inputs,
            kv_cache,
            latent_out,
            state_cache,
            out,
            ..
        } = self;
        let compress_ratio = *compress_ratio;
        let record_order = *record_order;
        match op {
            Op::RopeQuantInsert => backend.rope_quant_insert(InsertArgs {
                latent: ro(inputs, "latent")?,
                positions: ro(inputs, "positions")?,
                cos_sin_cache: ro(inputs, "cos_sin")?,
                kv_cache: rw(kv_cache, "kv_cache")?,
                slot_mapping: ro(inputs, "slot_mapping")?,
                compress_ratio,
                fp8_scale: opt(inputs, "fp8_scale"),
                record_order,
            }),
            Op::SaveRingRows => backend.save_ring_rows(RingArgs {
                rows: ro(inputs, "rows")?,
                slot_mapping: ro(inputs, "slot_mapping")?,
                state_cache: rw(state_cache, "state_cache")?,
            }),
            Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
                let compress = CompressArgs {
                    kv_score: ro(inputs, "kv_score")?,
                    positions: ro(inputs, "positions")?,
                    state_cache: state_cache
                        .as_mut()
                        .map(|b| TensorMut::new(&mut b.buf, b.desc)),
                    slot_mapping: ro(inputs, "slot_mapping")?,
                    query_start_loc: opt(inputs, "query_start_loc"),
                    token_to_req_indices: opt(inputs, "token_to_req_indices"),
                    rms_norm_weight: ro(inputs, "rms_norm_weight")?,
                    rms_norm_eps: *eps,
                    compress_ratio,
                    latent_out: rw(latent_out, "latent_out")?,
                    prev_rows: opt(inputs, "prev_rows"),
                    prev_row_indices: opt(inputs, "prev_row_indices"),
                };
                if *op == Op::FusedSaveCompressNorm {
                    backend.fused_save_compress_norm(compress)
                } else {
                    backend.fused_compress_insert(FusedArgs {
                        compress,
                        skip_latent_out: *skip_latent_out,
                        cos_sin_cache: ro(inputs, "cos_sin")?,
                        kv_cache: rw(kv_cache, "kv_cache")?,
                        cache_slot_mapping: ro(inputs, "cache_slot_mapping")?,
                        fp8_scale: opt(inputs, "fp8_scale"),
                        record_order,
                    })
                }
            }
            Op::GatherDequant => {
                let index = match opt(inputs, "slot_mapping") {
                    Some(slot_mapping) => GatherIndex::Slots { slot_mapping },
                    None => GatherIndex::BlockTable {
                        block_table: ro(inputs, "block_table")?,
                        cu_seq_lens: ro(inputs, "cu_seq_lens")?,
                        seq_starts: opt(inputs, "seq_starts"),
                    },
                };
                backend.gather_dequant(GatherArgs {
                    kv_cache: kv_cache
                        .as_ref()
                        .map(|b| Tensor::new(&b.buf, b.desc))
                        .ok_or_else(|| Error::Vectors("no in.kv_cache".into()))?,
                    index,
                    fp8_scale: opt(inputs, "fp8_scale"),
                    out: rw(out, "out")?,
                    record_order,
                })
            }
        }
    }

    /// Rewrites the written tensors with the file's inputs.
    pub fn reset(&mut self, backend: &B) -> Result<()> {
        let file = self.file;
        let op = self.op;
        for (name, b) in OUTPUT_NAMES.iter().zip([
            &mut self.kv_cache,
            &mut self.latent_out,
            &mut self.state_cache,
            &mut self.out,
        ]) {
            if !op.writes(name) {
                continue;
            }
            if let (Some(b), Some(t)) = (b.as_mut(), file.input(name)) {
                backend.write(&mut b.buf, &t.data)?;
            }
        }
        Ok(())
    }

    /// The written tensors' bytes, by output name (waits for the backend).
    pub fn outputs(&self, backend: &B) -> Result<Vec<(&'static str, Vec<u8>)>> {
        let mut out = Vec::new();
        for (name, b) in OUTPUT_NAMES.iter().zip([
            &self.kv_cache,
            &self.latent_out,
            &self.state_cache,
            &self.out,
        ]) {
            if let Some(b) = b.as_ref().filter(|_| self.op.writes(name)) {
                out.push((*name, backend.read(&b.buf)?));
            }
        }
        Ok(out)
    }
}
