//! A deliberately wrong backend for the harnesses' own tests: the CPU
//! reference whose reads come back with one byte flipped, so a check that
//! passes it cannot be comparing anything (`#[path]`-included; each test
//! file uses one of the two flips).

#![allow(dead_code)]

use dsv4_kvcache::backend::Backend;
use dsv4_kvcache::{
    CompressArgs, CpuBackend, FusedArgs, GatherArgs, IndexerKArgs, InsertArgs, Result, RingArgs,
    SkipCounts,
};

/// Which byte of every read is flipped, and by which mask.
#[derive(Clone, Copy)]
pub enum Flip {
    /// The first byte, XOR the mask.
    First(u8),
    /// The last byte, XOR the mask.
    Last(u8),
}

/// The CPU reference whose reads come back with a byte flipped.
pub struct FlipsAByte(pub CpuBackend, pub Flip);

impl FlipsAByte {
    /// A fresh CPU reference flipping `flip`.
    pub fn new(flip: Flip) -> Self {
        FlipsAByte(CpuBackend::new(), flip)
    }
}

impl Backend for FlipsAByte {
    type Buffer = <CpuBackend as Backend>::Buffer;
    fn name(&self) -> String {
        match self.1 {
            Flip::First(_) => "cpu, reads with their first byte flipped".into(),
            Flip::Last(_) => "cpu, reads with their last byte flipped".into(),
        }
    }
    fn sanitize(&self) -> bool {
        self.0.sanitize()
    }
    fn set_sanitize(&mut self, on: bool) {
        self.0.set_sanitize(on)
    }
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer> {
        self.0.upload(bytes)
    }
    fn write(&self, buf: &mut Self::Buffer, bytes: &[u8]) -> Result<()> {
        self.0.write(buf, bytes)
    }
    fn read(&self, buf: &Self::Buffer) -> Result<Vec<u8>> {
        let mut v = self.0.read(buf)?;
        let (byte, mask) = match self.1 {
            Flip::First(m) => (v.first_mut(), m),
            Flip::Last(m) => (v.last_mut(), m),
        };
        if let Some(b) = byte {
            *b ^= mask;
        }
        Ok(v)
    }
    fn fused_save_compress_norm(&self, a: CompressArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.fused_save_compress_norm(a)
    }
    fn rope_quant_insert(&self, a: InsertArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.rope_quant_insert(a)
    }
    fn save_ring_rows(&self, a: RingArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.save_ring_rows(a)
    }
    fn fused_compress_insert(&self, a: FusedArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.fused_compress_insert(a)
    }
    fn gather_dequant(&self, a: GatherArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.gather_dequant(a)
    }
    fn indexer_k_norm_rope_store(&self, a: IndexerKArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.indexer_k_norm_rope_store(a)
    }
    fn take_skip_counts(&self) -> Result<SkipCounts> {
        self.0.take_skip_counts()
    }
    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}
