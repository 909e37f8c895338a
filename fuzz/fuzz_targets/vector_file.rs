//! A vector file from arbitrary bytes: parsed and, when it parses, replayed
//! on the CPU reference, as `dsv4-kvcache verify` does. Any panic or abort
//! is a bug; an error or a mismatch is the expected end.
#![no_main]

use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::CpuBackend;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = VectorFile::from_bytes(data) {
        // One thread: the fuzzer runs many inputs per second.
        if let Ok(mut cpu) = CpuBackend::with_threads(1) {
            if let Ok(report) = f.replay(&mut cpu) {
                let _ = report.passed();
            }
        }
    }
});
