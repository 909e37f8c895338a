//! The device's self-check of the hardware conversions its kernels use in
//! place of the software definitions (`kv_check_hw_formats` in
//! `kernels-hip/kv_copy.hip`): every f32 bit pattern through each one,
//! against `formats::bf16_from_f32` and `formats::e4m3_from_f32`.

use super::bind::DevAddr;
use super::{Driver, GpuBackend};
use crate::backend::Backend;
use crate::error::Result;
use crate::kernel_abi::{self, Geometry, Kernel};
use std::ffi::c_void;

/// What [`GpuBackend::check_hw_formats`] found over all 2^32 f32 bit
/// patterns, each checked in both halves of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HwFormatCheck {
    /// The kernels convert f32 pairs to BF16 in hardware on this device
    /// (checked on every input, NaNs included).
    pub bf16x2: bool,
    /// The kernels convert f32 pairs to e4m3 in hardware on this device
    /// (checked on every non-NaN input, the only ones they hand it).
    pub e4m3x2: bool,
    /// Pairs whose hardware BF16 conversion differed from the definition.
    pub bf16x2_mismatches: u64,
    /// Pairs whose hardware e4m3 conversion differed from the definition.
    pub e4m3x2_mismatches: u64,
    /// The f32 bits of a pair's low half that mismatched, if any did.
    pub example: Option<u32>,
}

impl HwFormatCheck {
    /// Whether every hardware conversion gave the definition's bits.
    pub fn exact(&self) -> bool {
        self.bf16x2_mismatches == 0 && self.e4m3x2_mismatches == 0
    }
}

/// Bit patterns a launch checks: the counters (`u32`) cannot wrap.
const CHUNK: u64 = 1 << 30;

impl<D: Driver> GpuBackend<D> {
    /// Runs the hardware conversions of this device's kernels on all 2^32
    /// f32 bit patterns against the software definitions (a few
    /// milliseconds), and waits for the result. A device whose kernels have
    /// no hardware conversion reports none and no mismatches.
    pub fn check_hw_formats(&self) -> Result<HwFormatCheck> {
        let out = self.alloc_zeroed(16)?;
        let f = self.function(Kernel::CheckHwFormats);
        let g = Geometry {
            grid: 4096,
            block_threads: kernel_abi::BLOCK_THREADS,
            groups_log2: 0,
            token_blocks: kernel_abi::TokenBlocks::Items,
            shared_bytes: 0,
        };
        let mut r = HwFormatCheck::default();
        for first in (0..1u64 << 32).step_by(CHUNK as usize) {
            let mut p = kernel_abi::HwCheckParams {
                out: out.addr(),
                first,
                count: CHUNK,
            };
            let mut host = [0u8; 16];
            // SAFETY: `out` holds the kernel's four counters and outlives
            // the launch and the copy, which the synchronize waits for.
            unsafe {
                self.drv.memset(out.addr(), 0, 16, self.stream())?;
                self.drv.launch(
                    f,
                    &g,
                    self.stream(),
                    &mut p as *mut kernel_abi::HwCheckParams as *mut c_void,
                )?;
                self.drv
                    .copy_to_host(&mut host, out.addr(), self.stream())?;
            }
            self.synchronize()?;
            let word = |i: usize| u32::from_le_bytes(host[4 * i..4 * i + 4].try_into().unwrap());
            r.bf16x2_mismatches += u64::from(word(0));
            r.e4m3x2_mismatches += u64::from(word(1));
            r.bf16x2 = word(2) & kernel_abi::defines::KV_HW_CHECK_BF16X2 != 0;
            r.e4m3x2 = word(2) & kernel_abi::defines::KV_HW_CHECK_E4M3X2 != 0;
            if word(0) != 0 || word(1) != 0 {
                r.example = Some(word(3));
            }
        }
        Ok(r)
    }
}
