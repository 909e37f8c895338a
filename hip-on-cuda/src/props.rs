//! The AMD devices the library can pretend to be, and where their properties
//! go in `hipDeviceProp_tR0600` (ROCm 6 and 7) and `hipDeviceProp_tR0000`.
//!
//! The offsets are checked against bindgen output of ROCm's headers by
//! `tests/hip_bindings.rs` (which reads this file's `R0600_FIELDS` table).

/// One AMD Instinct model's reported properties.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    /// The value `HIPCUDA_DEVICE` selects it with.
    pub key: &'static str,
    /// `hipDeviceGetName` / `name`.
    pub name: &'static str,
    /// `gcnArchName`, as ROCm reports it on that part.
    pub arch: &'static str,
    /// Compute units (`multiProcessorCount`).
    pub compute_units: i32,
    /// LDS bytes a workgroup may use (`sharedMemPerBlock`) and a CU has.
    pub lds_bytes: usize,
    /// `major`, `minor` (gfx9xy -> 9, x).
    pub major: i32,
    /// See `major`.
    pub minor: i32,
    /// Peak engine clock in kHz (`clockRate`).
    pub clock_khz: i32,
    /// L2 bytes per XCD (`l2CacheSize`).
    pub l2_bytes: i32,
}

/// MI300X (gfx942), MI355X (gfx950), MI210 and one MI250X GCD (gfx90a), and
/// MI100 (gfx908: a real part this library builds no code object for).
pub const PROFILES: &[Profile] = &[
    Profile {
        key: "mi300x",
        name: "AMD Instinct MI300X",
        arch: "gfx942:sramecc+:xnack-",
        compute_units: 304,
        lds_bytes: 64 * 1024,
        major: 9,
        minor: 4,
        clock_khz: 2_100_000,
        l2_bytes: 4 << 20,
    },
    Profile {
        key: "mi355x",
        name: "AMD Instinct MI355X",
        arch: "gfx950:sramecc+:xnack-",
        compute_units: 256,
        lds_bytes: 160 * 1024,
        major: 9,
        minor: 5,
        clock_khz: 2_400_000,
        l2_bytes: 4 << 20,
    },
    Profile {
        key: "mi210",
        name: "AMD Instinct MI210",
        arch: "gfx90a:sramecc+:xnack-",
        compute_units: 104,
        lds_bytes: 64 * 1024,
        major: 9,
        minor: 0,
        clock_khz: 1_700_000,
        l2_bytes: 8 << 20,
    },
    Profile {
        // One of an MI250X's two GCDs, each its own device to ROCm.
        key: "mi250x",
        name: "AMD Instinct MI250X",
        arch: "gfx90a:sramecc+:xnack-",
        compute_units: 110,
        lds_bytes: 64 * 1024,
        major: 9,
        minor: 0,
        clock_khz: 1_700_000,
        l2_bytes: 8 << 20,
    },
    Profile {
        key: "mi100",
        name: "AMD Instinct MI100",
        arch: "gfx908:sramecc+:xnack-",
        compute_units: 120,
        lds_bytes: 64 * 1024,
        major: 9,
        minor: 0,
        clock_khz: 1_502_000,
        l2_bytes: 8 << 20,
    },
];

/// `sizeof(hipDeviceProp_tR0600)`.
pub const R0600_SIZE: usize = 1472;

/// Byte offsets in `hipDeviceProp_tR0600` of the fields this library fills.
pub const R0600_FIELDS: &[(&str, usize)] = &[
    ("name", 0),
    ("totalGlobalMem", 288),
    ("sharedMemPerBlock", 296),
    ("regsPerBlock", 304),
    ("warpSize", 308),
    ("maxThreadsPerBlock", 320),
    ("clockRate", 348),
    ("major", 360),
    ("minor", 364),
    ("multiProcessorCount", 388),
    ("l2CacheSize", 616),
    ("maxThreadsPerMultiProcessor", 624),
    ("sharedMemPerMultiprocessor", 640),
    ("gcnArchName", 1160),
    ("maxSharedMemoryPerMultiProcessor", 1416),
];

/// `gcnArchName` in the legacy `hipDeviceProp_tR0000` (only `name` and this
/// field are filled in that layout).
pub const R0000_GCN_ARCH_NAME: usize = 396;

fn offset(field: &str) -> usize {
    R0600_FIELDS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, o)| *o)
        .expect("field in R0600_FIELDS")
}

fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

/// `s` as a NUL-terminated C string of at most 256 bytes at `off`.
fn put_str(buf: &mut [u8], off: usize, s: &str) {
    let n = s.len().min(255);
    put(buf, off, &s.as_bytes()[..n]);
    buf[off + n] = 0;
}

/// Fills a zeroed `hipDeviceProp_tR0600` for `p` with `total_mem` bytes of
/// global memory (the real GPU's: allocations are bounded by it).
pub fn fill_r0600(buf: &mut [u8; R0600_SIZE], p: &Profile, arch: &str, total_mem: usize) {
    buf.fill(0);
    let b = &mut buf[..];
    put_str(b, offset("name"), p.name);
    put(b, offset("totalGlobalMem"), &total_mem.to_ne_bytes());
    put(b, offset("sharedMemPerBlock"), &p.lds_bytes.to_ne_bytes());
    put(b, offset("regsPerBlock"), &65536i32.to_ne_bytes());
    put(b, offset("warpSize"), &64i32.to_ne_bytes());
    put(b, offset("maxThreadsPerBlock"), &1024i32.to_ne_bytes());
    put(b, offset("clockRate"), &p.clock_khz.to_ne_bytes());
    put(b, offset("major"), &p.major.to_ne_bytes());
    put(b, offset("minor"), &p.minor.to_ne_bytes());
    put(
        b,
        offset("multiProcessorCount"),
        &p.compute_units.to_ne_bytes(),
    );
    put(b, offset("l2CacheSize"), &p.l2_bytes.to_ne_bytes());
    put(
        b,
        offset("maxThreadsPerMultiProcessor"),
        &2048i32.to_ne_bytes(),
    );
    put(
        b,
        offset("sharedMemPerMultiprocessor"),
        &p.lds_bytes.to_ne_bytes(),
    );
    put_str(b, offset("gcnArchName"), arch);
    put(
        b,
        offset("maxSharedMemoryPerMultiProcessor"),
        &p.lds_bytes.to_ne_bytes(),
    );
}
