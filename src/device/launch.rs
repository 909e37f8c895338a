//! Launch policy: which kernel runs a validated plan, and in what shape.
//!
//! The choices (groups per block, the CR2 mapping of items to groups,
//! screened token blocks, tile-major inserts) are functions of a
//! [`LaunchPolicy`] value, which a GPU backend holds
//! ([`crate::backend::gpu::GpuBackend::set_launch_policy`]). The default is
//! the measured heuristics; [`LaunchPolicy::from_env`] builds one from the
//! `DSV4_KVCACHE_*` override variables, which are only one way to make a
//! policy, and [`LaunchPolicy::MAPPINGS`] lists the eight policies that
//! together reach every kernel (the device parity test runs them all). The
//! thresholds' measurements are in `docs/tuning.md`, "Host launch policy".

use crate::error::{Error, Result};
use crate::kernel_abi::{
    compress_kernel, compress_wide_kernel, cos_sin_needs_wide, fused_kernel, fused_long_kernel,
    fused_pair_kernel, fused_team_kernel, fused_team_mtp_kernel, fused_wide_kernel, insert_kernel,
    insert_large_kernel, insert_tiles_kernel, insert_wide_kernel, weight_needs_wide, Geometry,
    Kernel, TokenBlocks, BLOCK_THREADS, CR2_PAIR_GROUPS, CR2_POOLED_BYTES, CR2_TEAM_GROUPS,
    GROUP_LANES,
};
use crate::ops::{CompressPlan, FusedPlan, InsertPlan, RingRowsPlan};

/// Token groups per block of a large launch (4 beat 8 for every kernel).
pub const GROUPS_PER_BLOCK: u32 = 4;
/// Token groups per block of a small (decode-size) launch: one AMD
/// wavefront, two NVIDIA warps, so that a decode step's few tokens spread
/// over the SMs / CUs.
pub const SMALL_GROUPS_PER_BLOCK: u32 = 2;
/// Launches of at most this many groups use [`SMALL_GROUPS_PER_BLOCK`].
pub const SMALL_LAUNCH_ITEMS: u64 = 2048;
/// CR1 inserts of more tokens than this run the 32-register V4 and MXFP8
/// kernels ([`insert_large_kernel`]): on the H200 (2026-12-05) they take
/// 12.6 and 6.9 % less time at 65,536 tokens, but V4 is 1.1-3.7 % slower
/// at 4096-16,384 and MXFP8 1-2.8 % at 16-2048 (docs/tuning.md, Occupancy
/// caps).
pub const LARGE_INSERT_TOKENS: u64 = 16384;
/// Decode batches of mostly one-token requests up to this many items
/// (requests plus tokens) run in teams of four, larger ones in pairs, which
/// leave fewer lanes idle while group 0 norms and emits.
pub const CR2_TEAM_MAX_ITEMS: u64 = 8192;
/// Long chunks (prefill) run unscreened teams up to this many items, fused
/// or plain (1536 tokens in four requests, measured; screened blocks won at
/// 2048 tokens): a team needs four warps per item, and once the teams
/// outnumber what the GPU runs at once, other shapes win.
pub const CR2_TEAM_MAX_ITEMS_LONG_CHUNKS: u64 = 1540;
/// Fused launches of long chunks above [`CR2_TEAM_MAX_ITEMS_LONG_CHUNKS`]
/// and up to this many items run screened teams (a token block covers four
/// tokens and pools the two that close a group).
pub const CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS: u64 = 2560;
/// Fused launches of long chunks above the screened-team limit and up to
/// this many items run one-pass lone groups; above it lone groups pooling by
/// halves, which fit more groups on an SM.
pub const CR2_LONE_MAX_ITEMS_LONG_CHUNKS: u64 = 3072;
/// Plain compresses of long chunks above [`CR2_TEAM_MAX_ITEMS_LONG_CHUNKS`]
/// and up to this many items run screened teams of
/// `kv_compress_cr2_team_chunks` (4096 tokens in four requests, measured),
/// larger ones lone groups pooling by halves (level with the teams at 8192
/// tokens).
pub const CR2_CHUNK_TEAM_MAX_ITEMS: u64 = 4100;
/// Unscreened launches of long chunks of the plain compressor from this many
/// items on give a token block two tokens (`TokenBlocks::TwoTokens`: half
/// the blocks, one of the two tokens closing a group); below it a block per
/// token was faster (4 requests at 16-512 tokens, measured).
pub const CR2_TWO_TOKEN_MIN_ITEMS: u64 = 1024;
/// Decode batches with more multi-token requests screen their tokens from
/// this many items on, on the multi-token kernels, whose request items also
/// pool a two-token chunk's second token.
pub const CR2_SCREEN_MIN_ITEMS_MULTI: u64 = 1536;
/// Decode batches of mostly one-token requests screen their tokens from this
/// many items on: their token items mostly pool nothing.
pub const CR2_SCREEN_MIN_ITEMS: u64 = 512;
/// Screened plain multi-token launches of at least this many items run in
/// pairs, `kv_compress_cr2_pair_mtp_spread`, whose token blocks run in runs
/// among the request blocks instead of after them all. Measured on the H200
/// (2026-12-05, docs/tuning.md, "Where the screened token blocks run"):
/// two-token requests at 16,384 tokens (24,576 items) 41.23 µs unspread,
/// 38.92 spread in teams, 38.76 in pairs; at 65,536 160.53, 145.90 and
/// 141.87. Below, spreading lost (token blocks one at a time 1.4 % slower
/// at 8192 tokens; in runs of 16-256, 16-20 % slower at 4096).
pub const CR2_SPREAD_MIN_ITEMS: u64 = 24_576;

/// How a CR2 launch spreads an item (a request's first group, or a token's)
/// over the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cr2Items {
    /// One group (32 lanes, 16 dims each) per item.
    Lone,
    /// A block of [`CR2_PAIR_GROUPS`] groups per item.
    Pairs,
    /// A block of [`CR2_TEAM_GROUPS`] groups per item.
    Teams,
    /// One group per item pooling its dims in two halves, so that the
    /// kernel fits 64 registers (four blocks per SM on sm_90): long chunks.
    LoneHalves,
}

/// How a CR2 launch runs, decided once per launch by
/// [`LaunchPolicy::cr2_shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cr2Shape {
    /// Groups per item.
    pub items: Cr2Items,
    /// What the token blocks of teams and pairs cover: a token's item, or,
    /// screened, a token per group (`kv_cr2_token_block`), or, swept, a
    /// token per lane (`kv_cr2_token_sweep`); always
    /// [`TokenBlocks::Items`] for lone groups.
    pub tokens: TokenBlocks,
    /// The multi-token kernels (`kv_compress_cr2_team_mtp`,
    /// `kv_compress_cr2_pair_mtp`, `kv_fused_cr2_team_mtp_*`), whose request
    /// items also pool a two-token chunk's second token.
    pub multi_token: bool,
    /// A plain compress of long chunks (prefill: fewer than half the
    /// tokens start a chunk) in teams, screened or not, which runs
    /// `kv_compress_cr2_team_chunks` (a token reads its rows with its
    /// chunk's bounds: nearly every odd position closes a group there).
    pub long_chunks: bool,
    /// A screened plain multi-token launch in pairs whose token blocks run
    /// in runs among the request blocks (`kv_compress_cr2_pair_mtp_spread`).
    pub spread: bool,
}

/// A kernel and the shape to launch it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its grid and blocks.
    pub geometry: Geometry,
}

/// The launch choices of a GPU backend. `None` in a field means "the
/// measured heuristic"; `Some` forces the choice (for testing every kernel
/// and for benchmarking).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchPolicy {
    /// Token groups per block of one-group-per-item launches: 2, 4 or 8.
    pub groups_per_block: Option<u32>,
    /// The CR2 mapping of items to groups.
    pub cr2_items: Option<Cr2Items>,
    /// Screened token blocks in CR2 team and pair launches.
    pub cr2_screen: Option<bool>,
    /// Tile-major CR1 inserts (where the layout has a tile-major kernel).
    pub insert_tiles: Option<bool>,
    /// The 32-register CR1 inserts of large launches (where the layout has
    /// one: V4, MXFP8).
    pub insert_large: Option<bool>,
    /// The multi-token pair kernel with its token blocks spread among the
    /// request blocks, in screened plain compresses (unless teams are
    /// forced).
    pub cr2_spread: Option<bool>,
    /// Two rows per group in `gather_dequant` launches (else a row a group:
    /// measured faster at every size, docs/tuning.md).
    pub gather_two_rows: Option<bool>,
    /// Each row over two groups in slot-form `gather_dequant` launches that
    /// have no two rows a group (else up to
    /// [`crate::gather::gather_split_max_rows`] rows).
    pub gather_split_rows: Option<bool>,
}

/// The override variables [`LaunchPolicy::from_env`] reads.
pub const POLICY_ENV_VARS: [&str; 8] = [
    "DSV4_KVCACHE_GROUPS_PER_BLOCK",
    "DSV4_KVCACHE_CR2_TEAMS",
    "DSV4_KVCACHE_CR2_SCREEN",
    "DSV4_KVCACHE_INSERT_TILES",
    "DSV4_KVCACHE_GATHER_TWO_ROWS",
    "DSV4_KVCACHE_GATHER_SPLIT_ROWS",
    "DSV4_KVCACHE_INSERT_LARGE",
    "DSV4_KVCACHE_CR2_SPREAD",
];

impl LaunchPolicy {
    /// The measured heuristics (nothing forced).
    pub const MEASURED: LaunchPolicy = LaunchPolicy {
        groups_per_block: None,
        cr2_items: None,
        cr2_screen: None,
        insert_tiles: None,
        insert_large: None,
        cr2_spread: None,
        gather_two_rows: None,
        gather_split_rows: None,
    };

    /// The eight policies that together launch every kernel on decode-sized
    /// cases, labelled with the environment that builds each: the measured
    /// heuristics (CR2 in teams, a token per group for CR1 inserts), lone
    /// groups, pairs, lone groups by halves, screened teams, screened pairs,
    /// tile-major and large-launch inserts with screened, spread CR2 pairs
    /// and gathers of a row per group, and blocks of 8 groups with
    /// tile-major inserts, lone CR2 groups and gathers of two rows per group
    /// (so both gather shapes run at every size).
    pub const MAPPINGS: [(&'static str, LaunchPolicy); 8] = {
        let m = LaunchPolicy::MEASURED;
        [
            ("measured heuristics", m),
            (
                "DSV4_KVCACHE_CR2_TEAMS=0",
                LaunchPolicy {
                    cr2_items: Some(Cr2Items::Lone),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_CR2_TEAMS=2",
                LaunchPolicy {
                    cr2_items: Some(Cr2Items::Pairs),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_CR2_TEAMS=3",
                LaunchPolicy {
                    cr2_items: Some(Cr2Items::LoneHalves),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_CR2_SCREEN=1",
                LaunchPolicy {
                    cr2_screen: Some(true),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_CR2_SCREEN=1 DSV4_KVCACHE_CR2_TEAMS=2",
                LaunchPolicy {
                    cr2_screen: Some(true),
                    cr2_items: Some(Cr2Items::Pairs),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_INSERT_TILES=1 DSV4_KVCACHE_INSERT_LARGE=1 DSV4_KVCACHE_CR2_SCREEN=1 DSV4_KVCACHE_CR2_SPREAD=1 DSV4_KVCACHE_GATHER_TWO_ROWS=0 DSV4_KVCACHE_GATHER_SPLIT_ROWS=0",
                LaunchPolicy {
                    insert_tiles: Some(true),
                    insert_large: Some(true),
                    cr2_screen: Some(true),
                    cr2_spread: Some(true),
                    gather_two_rows: Some(false),
                    gather_split_rows: Some(false),
                    ..m
                },
            ),
            (
                "DSV4_KVCACHE_GROUPS_PER_BLOCK=8 DSV4_KVCACHE_INSERT_TILES=1 DSV4_KVCACHE_CR2_TEAMS=0 DSV4_KVCACHE_GATHER_TWO_ROWS=1",
                LaunchPolicy {
                    groups_per_block: Some(8),
                    insert_tiles: Some(true),
                    cr2_items: Some(Cr2Items::Lone),
                    gather_two_rows: Some(true),
                    ..m
                },
            ),
        ]
    };

    /// The policy the environment asks for: [`POLICY_ENV_VARS`], unset or
    /// empty meaning "measured". A value that is not one of the documented
    /// ones is an [`Error::Value`] naming the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`LaunchPolicy::from_env`], reading the variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let read = |var: &'static str, allowed: &str| -> Result<Option<u32>> {
            let Some(v) = get(var) else { return Ok(None) };
            let v = v.trim();
            if v.is_empty() {
                return Ok(None);
            }
            match v.parse::<u32>() {
                Ok(x) if allowed.split(',').any(|a| a == v) => Ok(Some(x)),
                _ => Err(Error::Value {
                    arg: var,
                    problem: format!("{v:?} is not one of {allowed}"),
                }),
            }
        };
        let switch = |var| Ok::<_, Error>(read(var, "0,1")?.map(|x| x == 1));
        Ok(LaunchPolicy {
            groups_per_block: read(POLICY_ENV_VARS[0], "2,4,8")?,
            cr2_items: read(POLICY_ENV_VARS[1], "0,1,2,3")?.map(|x| match x {
                0 => Cr2Items::Lone,
                1 => Cr2Items::Teams,
                2 => Cr2Items::Pairs,
                _ => Cr2Items::LoneHalves,
            }),
            cr2_screen: switch(POLICY_ENV_VARS[2])?,
            insert_tiles: switch(POLICY_ENV_VARS[3])?,
            gather_two_rows: switch(POLICY_ENV_VARS[4])?,
            gather_split_rows: switch(POLICY_ENV_VARS[5])?,
            insert_large: switch(POLICY_ENV_VARS[6])?,
            cr2_spread: switch(POLICY_ENV_VARS[7])?,
        })
    }

    /// Launch shape for `items` groups (one token or request each): blocks
    /// of [`SMALL_GROUPS_PER_BLOCK`] groups at decode sizes, else
    /// [`GROUPS_PER_BLOCK`], unless the policy forces a size.
    pub fn geometry(&self, items: u64) -> Geometry {
        let gpb = self
            .groups_per_block
            .unwrap_or(if items <= SMALL_LAUNCH_ITEMS {
                SMALL_GROUPS_PER_BLOCK
            } else {
                GROUPS_PER_BLOCK
            });
        Self::geometry_of_blocks(gpb, items)
    }

    /// Launch shape for `items` groups in blocks of `gpb` groups (a power of
    /// two, at most [`BLOCK_THREADS`]` / `[`GROUP_LANES`], the kernels'
    /// bound), whatever the policy says: for kernels built for one block size.
    pub fn geometry_of_blocks(gpb: u32, items: u64) -> Geometry {
        debug_assert!(gpb.is_power_of_two() && gpb * GROUP_LANES <= BLOCK_THREADS);
        Geometry {
            grid: items.div_ceil(gpb as u64).max(1) as u32,
            block_threads: GROUP_LANES * gpb,
            groups_log2: gpb.trailing_zeros(),
            token_blocks: TokenBlocks::Items,
            shared_bytes: 0,
        }
    }

    /// The shape of a CR2 launch of `n` tokens in `num_reqs` requests
    /// (`fused`: of `fused_compress_insert`).
    ///
    /// At decode sizes (at least half the tokens start a chunk) a lone
    /// group's pooling chain is most of the kernel time and a team splits it
    /// four ways: teams, or pairs for large batches of mostly one-token
    /// requests. Long chunks run teams, then (fused) lone groups, then lone
    /// groups by halves as they grow; the plain compressor's teams read a
    /// token's rows with its chunk's bounds (`kv_compress_cr2_team_chunks`)
    /// and reach further. Token blocks are screened where most of them
    /// would pool nothing, and in the plain compressor swept (a token per
    /// lane) where there are no more tokens than requests; screened launches
    /// that are not mostly one-token
    /// requests run the multi-token kernels (fused ones in teams only), so
    /// that a two-token chunk's rows are read once.
    pub fn cr2_shape(&self, n: u64, num_reqs: u64, fused: bool) -> Cr2Shape {
        let items = n + num_reqs;
        let decode = 2 * num_reqs >= n;
        let one_token = mostly_one_token(n, num_reqs);
        let shape = self.cr2_items.unwrap_or(if decode {
            if one_token && items > CR2_TEAM_MAX_ITEMS {
                Cr2Items::Pairs
            } else {
                Cr2Items::Teams
            }
        } else if !fused {
            if items <= CR2_CHUNK_TEAM_MAX_ITEMS {
                Cr2Items::Teams
            } else {
                Cr2Items::LoneHalves
            }
        } else if items <= CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS {
            Cr2Items::Teams
        } else if items <= CR2_LONE_MAX_ITEMS_LONG_CHUNKS {
            Cr2Items::Lone
        } else {
            Cr2Items::LoneHalves
        });
        let teams = matches!(shape, Cr2Items::Teams | Cr2Items::Pairs);
        let screen = if !decode {
            items > CR2_TEAM_MAX_ITEMS_LONG_CHUNKS
        } else if one_token {
            items >= CR2_SCREEN_MIN_ITEMS
        } else {
            items >= CR2_SCREEN_MIN_ITEMS_MULTI
        };
        let screened = teams && self.cr2_screen.unwrap_or(screen);
        // With no more tokens than requests, a token pools a group only
        // where requests are empty: a lane per token checks them.
        // (The plain compressor only: the fused kernels keep screened
        // blocks, kernels-hip/kv_compress.hip.)
        // The plain compressor's long-chunk teams have a kernel of their own,
        // whose larger unscreened launches give a token block two tokens.
        let long_chunks = !decode && !fused && shape == Cr2Items::Teams;
        let tokens = match (screened, n <= num_reqs && !fused) {
            (false, _) if long_chunks && items >= CR2_TWO_TOKEN_MIN_ITEMS => TokenBlocks::TwoTokens,
            (false, _) => TokenBlocks::Items,
            (true, false) => TokenBlocks::Screened,
            (true, true) => TokenBlocks::Swept,
        };
        let multi_token =
            screened && !one_token && !long_chunks && (shape == Cr2Items::Teams || !fused);
        // Spread launches run in pairs (measured faster than teams there);
        // forced teams keep their unspread kernel.
        let spread = multi_token
            && !fused
            && self.cr2_items != Some(Cr2Items::Teams)
            && self.cr2_spread.unwrap_or(items >= CR2_SPREAD_MIN_ITEMS);
        Cr2Shape {
            items: if spread { Cr2Items::Pairs } else { shape },
            tokens,
            multi_token,
            long_chunks,
            spread,
        }
    }

    /// Whether an insert of `n` tokens at `compress_ratio` runs a tile-major
    /// kernel (where its layout has one): CR1 above [`SMALL_LAUNCH_ITEMS`]
    /// tokens. At decode sizes a block's last warp would run both the NoPE
    /// and the RoPE path, and CR2 writes only every other token, so neither
    /// gains; the tile-major kernels are CR1 only (they skip the
    /// compress-ratio test), whatever the policy forces.
    pub fn insert_uses_tiles(&self, compress_ratio: u32, n: u64) -> bool {
        compress_ratio == 1 && self.insert_tiles.unwrap_or(n > SMALL_LAUNCH_ITEMS)
    }

    /// Whether a CR1 insert of `n` tokens that runs a token per group runs
    /// its layout's 32-register kernel (where it has one): above
    /// [`LARGE_INSERT_TOKENS`]. Only CR1 was measured; CR2 keeps the
    /// 40-register kernels, whatever the policy forces.
    pub fn insert_uses_large(&self, compress_ratio: u32, n: u64) -> bool {
        compress_ratio == 1 && self.insert_large.unwrap_or(n > LARGE_INSERT_TOKENS)
    }

    /// The launch of an insert plan. An F16 cos/sin table runs the layout's
    /// generic kernel (a token per group), whatever the policy forces.
    pub fn insert_launch(&self, p: &InsertPlan) -> Launch {
        let geometry = self.geometry(p.n as u64);
        if cos_sin_needs_wide(p.cos_sin_dtype) {
            return Launch {
                kernel: insert_wide_kernel(p.cache.layout),
                geometry,
            };
        }
        match insert_tiles_kernel(p.cache.layout)
            .filter(|_| self.insert_uses_tiles(p.compress_ratio, p.n as u64))
        {
            Some(kernel) => Launch {
                kernel,
                geometry: tiles_geometry(kernel, geometry, p.n as u64),
            },
            None => Launch {
                kernel: insert_large_kernel(p.cache.layout)
                    .filter(|_| self.insert_uses_large(p.compress_ratio, p.n as u64))
                    .unwrap_or_else(|| insert_kernel(p.cache.layout)),
                geometry,
            },
        }
    }

    /// The launch of a `save_ring_rows` plan.
    pub fn ring_rows_launch(&self, p: &RingRowsPlan) -> Launch {
        Launch {
            kernel: Kernel::SaveRingRows,
            geometry: self.geometry(p.n as u64),
        }
    }

    /// The launch of a compress plan's items (`fused`: of a fused plan): the
    /// shape by [`LaunchPolicy::cr2_shape`] for CR2 (one group per item for
    /// CR1, and for the generic kernels, `wide`), and `kernel`, the op's
    /// kernel for that shape.
    fn compressor_launch(
        &self,
        p: &CompressPlan,
        fused: bool,
        wide: bool,
        kernel: impl Fn(Cr2Shape) -> Kernel,
    ) -> Launch {
        let items = compress_items(p);
        let (n, reqs) = (p.n as u64, p.num_reqs() as u64);
        let shape = if p.compress_ratio == 2 && !wide {
            self.cr2_shape(n, reqs, fused)
        } else {
            Cr2Shape {
                items: Cr2Items::Lone,
                tokens: TokenBlocks::Items,
                multi_token: false,
                long_chunks: false,
                spread: false,
            }
        };
        let team = |groups| match shape.tokens {
            TokenBlocks::Items => team_geometry(items, groups),
            TokenBlocks::TwoTokens => two_token_geometry(n, reqs, groups),
            TokenBlocks::Screened | TokenBlocks::Swept => {
                screened_team_geometry(n, reqs, groups, shape.tokens)
            }
        };
        Launch {
            kernel: kernel(shape),
            geometry: match shape.items {
                Cr2Items::Lone | Cr2Items::LoneHalves => self.geometry(items),
                Cr2Items::Teams => team(CR2_TEAM_GROUPS),
                Cr2Items::Pairs => team(CR2_PAIR_GROUPS),
            },
        }
    }

    /// The launch of a compress plan. A weight that is not BF16 runs the
    /// generic kernels (one group per item), whatever the policy forces.
    pub fn compress_launch(&self, p: &CompressPlan) -> Launch {
        if weight_needs_wide(p.weight_dtype) {
            return self
                .compressor_launch(p, false, true, |_| compress_wide_kernel(p.compress_ratio));
        }
        self.compressor_launch(p, false, false, |shape| {
            compress_cr2_kernel(p.compress_ratio, shape)
        })
    }

    /// The launch of a fused plan. A weight that is not BF16, or an F16
    /// cos/sin table, runs the generic kernels (one group per item),
    /// whatever the policy forces.
    pub fn fused_launch(&self, p: &FusedPlan) -> Launch {
        let layout = p.insert.cache.layout;
        let cr = p.compress.compress_ratio;
        if weight_needs_wide(p.compress.weight_dtype) || cos_sin_needs_wide(p.insert.cos_sin_dtype)
        {
            return self
                .compressor_launch(&p.compress, true, true, |_| fused_wide_kernel(cr, layout));
        }
        self.compressor_launch(&p.compress, true, false, |shape| {
            match (shape.items, shape.multi_token) {
                (Cr2Items::Lone, _) => fused_kernel(cr, layout),
                (Cr2Items::Teams, true) => fused_team_mtp_kernel(layout),
                (Cr2Items::Teams, false) => fused_team_kernel(layout),
                (Cr2Items::Pairs, _) => fused_pair_kernel(layout),
                (Cr2Items::LoneHalves, _) => fused_long_kernel(layout),
            }
        })
    }

    /// A short description of what this policy runs on decode-sized cases,
    /// for test and bench reports.
    pub fn describe(&self) -> String {
        let s = self.cr2_shape(1, 1, false);
        let cr2 = match (s.items, s.tokens) {
            (Cr2Items::Teams, TokenBlocks::Items) => "teams",
            (Cr2Items::Teams, _) => "teams, tokens screened",
            (Cr2Items::Pairs, TokenBlocks::Items) => "pairs",
            (Cr2Items::Pairs, _) => "pairs, tokens screened",
            (Cr2Items::Lone, _) => "one group per item",
            (Cr2Items::LoneHalves, _) => "one group per item, by halves",
        };
        let tiles = match (self.insert_uses_tiles(1, 1), self.insert_uses_large(1, 1)) {
            (true, false) => "tile-major where the layout has it",
            (true, true) => "tile-major where the layout has it, else at 32 registers (V4, MXFP8)",
            (false, false) => "a token per group",
            (false, true) => "a token per group, at 32 registers for V4 and MXFP8",
        };
        let gpb = self
            .groups_per_block
            .map_or("by size".to_string(), |g| g.to_string());
        let gather = match (self.gather_two_rows, self.gather_split_rows) {
            (Some(true), _) => "two rows per group",
            (_, None) => "a row per group, split over two at few rows",
            (_, Some(false)) => "a row per group",
            (_, Some(true)) => "a row over two groups (slot form)",
        };
        format!(
            "CR2 kernels: {cr2}; CR1 inserts: {tiles}; gathers: {gather}; groups per block: {gpb}"
        )
    }
}

/// The plain compressor's kernel for a launch of `shape` (CR2; CR1 runs
/// lone groups).
fn compress_cr2_kernel(compress_ratio: u32, shape: Cr2Shape) -> Kernel {
    match (shape.items, shape.multi_token, shape.tokens) {
        (Cr2Items::Lone, _, _) => compress_kernel(compress_ratio),
        (Cr2Items::Teams, _, _) if shape.long_chunks => Kernel::CompressCr2TeamChunks,
        (Cr2Items::Teams, true, _) => Kernel::CompressCr2TeamMtp,
        (Cr2Items::Teams, false, TokenBlocks::Swept) => Kernel::CompressCr2TeamSwept,
        (Cr2Items::Teams, false, _) => Kernel::CompressCr2Team,
        (Cr2Items::Pairs, true, _) if shape.spread => Kernel::CompressCr2PairMtpSpread,
        (Cr2Items::Pairs, true, _) => Kernel::CompressCr2PairMtp,
        (Cr2Items::Pairs, false, TokenBlocks::Swept) => Kernel::CompressCr2PairSwept,
        (Cr2Items::Pairs, false, _) => Kernel::CompressCr2Pair,
        (Cr2Items::LoneHalves, _, _) => Kernel::CompressCr2Long,
    }
}

/// Shape of a tile-major insert of `n` tokens by `kernel` in blocks of `g`'s
/// size. NVFP4's kernel maps threads to tiles in runs of 8 tokens over 256
/// threads (`kv_tile_of_thread_runs`, kernels-hip/kv_insert.hip), so its grid
/// counts runs; the BF16 and FP8 rows keep `g` (a block's G tokens,
/// `kv_tile_of_thread`).
pub fn tiles_geometry(kernel: Kernel, g: Geometry, n: u64) -> Geometry {
    if kernel != Kernel::InsertNvfp4Tiles {
        return g;
    }
    Geometry {
        grid: (n.div_ceil(TILE_RUN_TOKENS) << (3 - g.groups_log2)).max(1) as u32,
        ..g
    }
}

/// Tokens of a run of NVFP4's tile-major map: 256 threads, a block of
/// [`BLOCK_THREADS`] at most.
pub const TILE_RUN_TOKENS: u64 = 8;

/// Shape of a team launch: one block of `groups` groups per item.
pub fn team_geometry(items: u64, groups: u32) -> Geometry {
    Geometry {
        grid: items.max(1) as u32,
        block_threads: GROUP_LANES * groups,
        groups_log2: groups.trailing_zeros(),
        token_blocks: TokenBlocks::Items,
        shared_bytes: CR2_POOLED_BYTES,
    }
}

/// Shape of a team launch of long chunks, `n` tokens in `num_reqs`
/// requests: a block per request, then a block per two tokens, with one
/// token's pooled buffer (`kv_cr2_token_pair`).
pub fn two_token_geometry(n: u64, num_reqs: u64, groups: u32) -> Geometry {
    Geometry {
        token_blocks: TokenBlocks::TwoTokens,
        ..team_geometry(num_reqs + n.div_ceil(2), groups)
    }
}

/// Shape of a screened or swept team launch of `n` tokens in `num_reqs`
/// requests: a block per request, then a block per `groups` tokens
/// (screened) or per `32 groups` (swept). Both pool a block's closing
/// tokens `groups` at a time into a pooled buffer per group, after a
/// closing position (8 bytes) per token the block covers; a swept block
/// adds a flag (4 bytes) per group.
pub fn screened_team_geometry(n: u64, num_reqs: u64, groups: u32, tokens: TokenBlocks) -> Geometry {
    let per_block = tokens.tokens_per_block(groups);
    let flags = if tokens == TokenBlocks::Swept {
        4 * groups
    } else {
        0
    };
    Geometry {
        token_blocks: tokens,
        shared_bytes: groups * CR2_POOLED_BYTES + 8 * per_block + flags,
        ..team_geometry(num_reqs + n.div_ceil(per_block as u64), groups)
    }
}

/// Whether at most one request in four has more than one token: the token
/// items then mostly pool nothing (a one-token request's group is its
/// request item's).
fn mostly_one_token(n: u64, num_reqs: u64) -> bool {
    4 * n <= 5 * num_reqs
}

/// Groups a compress (or fused) launch needs: CR2 adds one per request.
pub fn compress_items(p: &CompressPlan) -> u64 {
    p.n as u64 + p.num_reqs() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexer_k::{indexer_k_launch, IndexerKFormat, IndexerKPlan};
    use crate::kernel_abi::BLOCK_THREADS;
    use crate::layout::RecordLayout;
    use crate::tensor::DType;

    const M: LaunchPolicy = LaunchPolicy::MEASURED;

    #[test]
    fn from_env_reads_every_variable_and_rejects_bad_values() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(LaunchPolicy::from_lookup(env(&[])).unwrap(), M);
        assert_eq!(
            LaunchPolicy::from_lookup(env(&[("DSV4_KVCACHE_CR2_TEAMS", " ")])).unwrap(),
            M
        );
        // Every mapping's label is the environment that builds it.
        for (label, want) in LaunchPolicy::MAPPINGS.iter().skip(1) {
            let vars: Vec<(String, String)> = label
                .split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("VAR=value");
                    (k.to_string(), v.to_string())
                })
                .collect();
            let got = LaunchPolicy::from_lookup(|k| {
                vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            })
            .unwrap();
            assert_eq!(got, *want, "{label}");
        }
        for (var, bad) in [
            ("DSV4_KVCACHE_GROUPS_PER_BLOCK", "3"),
            ("DSV4_KVCACHE_CR2_TEAMS", "4"),
            ("DSV4_KVCACHE_CR2_SCREEN", "yes"),
            ("DSV4_KVCACHE_INSERT_TILES", "2"),
            ("DSV4_KVCACHE_GATHER_TWO_ROWS", "on"),
            ("DSV4_KVCACHE_GATHER_SPLIT_ROWS", "2"),
            ("DSV4_KVCACHE_INSERT_LARGE", "yes"),
            ("DSV4_KVCACHE_CR2_SPREAD", "2"),
        ] {
            let r = LaunchPolicy::from_lookup(|k| (k == var).then(|| bad.to_string()));
            assert!(
                matches!(r, Err(Error::Value { arg, .. }) if arg == var),
                "{var}={bad}: {r:?}"
            );
        }
    }

    #[test]
    fn the_mappings_reach_every_kernel() {
        // Every kernel name a decode-sized case can reach under the eight
        // mappings: the kernel choice depends on the policy, compress
        // ratio, layout and the (n, requests) mix only.
        let mut seen = std::collections::BTreeSet::new();
        for (_, pol) in LaunchPolicy::MAPPINGS {
            for (n, reqs) in [(1u64, 1u64), (8, 4), (6, 2), (2, 1), (3, 4)] {
                for fused in [false, true] {
                    let s = pol.cr2_shape(n, reqs, fused);
                    for l in RecordLayout::ALL {
                        let k = match (fused, s.items, s.multi_token) {
                            (false, ..) => compress_cr2_kernel(2, s),
                            (true, Cr2Items::Lone, _) => fused_kernel(2, l),
                            (true, Cr2Items::Teams, true) => fused_team_mtp_kernel(l),
                            (true, Cr2Items::Teams, false) => fused_team_kernel(l),
                            (true, Cr2Items::Pairs, _) => fused_pair_kernel(l),
                            (true, Cr2Items::LoneHalves, _) => fused_long_kernel(l),
                        };
                        seen.insert(k);
                    }
                }
            }
            for l in RecordLayout::ALL {
                seen.insert(compress_kernel(1));
                seen.insert(fused_kernel(1, l));
                seen.insert(insert_kernel(l));
                if pol.insert_uses_tiles(1, 1) {
                    if let Some(k) = insert_tiles_kernel(l) {
                        seen.insert(k);
                    }
                }
                if pol.insert_uses_large(1, 1) {
                    if let Some(k) = insert_large_kernel(l) {
                        seen.insert(k);
                    }
                }
            }
            seen.insert(Kernel::SaveRingRows);
        }
        // The generic kernels run by input dtype under every mapping
        // (other_input_dtypes_run_the_generic_kernels_and_bf16_weights_the_tuned_ones).
        for l in RecordLayout::ALL {
            for cr in [1, 2] {
                seen.insert(compress_wide_kernel(cr));
                seen.insert(fused_wide_kernel(cr, l));
            }
            seen.insert(insert_wide_kernel(l));
        }
        // The copy kernel is the bench's roofline and the other the
        // device's self-check, not an operation's.
        seen.insert(Kernel::Copy);
        seen.insert(Kernel::CheckHwFormats);
        // The reader's kernels: the slot form runs its own where the
        // mapping gives a row a group or a row over two.
        for (_, pol) in LaunchPolicy::MAPPINGS {
            for l in RecordLayout::ALL {
                for f32 in [false, true] {
                    for n in [1usize, 1 << 20] {
                        for slots in [false, true] {
                            let launch =
                                crate::gather::gather_launch(&pol, l, n, slots).expect("rows");
                            seen.insert(crate::gather::gather_kernel(l, f32, slots, launch.rows));
                        }
                    }
                }
            }
        }
        // The indexer key store: a kernel per format under every mapping.
        for (_, pol) in LaunchPolicy::MAPPINGS {
            for format in [IndexerKFormat::Fp8, IndexerKFormat::Mxfp4] {
                seen.insert(indexer_k_launch(&pol, &indexer_k_plan(format)).kernel);
            }
        }
        let missing: Vec<_> = Kernel::ALL.iter().filter(|k| !seen.contains(*k)).collect();
        assert!(missing.is_empty(), "no mapping launches {missing:?}");
    }

    /// An indexer key store plan of 64 tokens in `format`; only what the
    /// launch reads is meaningful.
    fn indexer_k_plan(format: IndexerKFormat) -> IndexerKPlan {
        use crate::indexer_k::{IndexerKCache, IndexerKOrder};
        use crate::ops::{IndexPlan, RowsPlan};
        let index = IndexPlan {
            offset: 0,
            is_i64: true,
            len: 64,
        };
        IndexerKPlan {
            n: 64,
            compress_ratio: 1,
            eps: 1e-6,
            k_pre: RowsPlan {
                offset: 0,
                row_stride: 128,
                rows: 64,
            },
            positions: index,
            slots: index,
            cos_sin: RowsPlan {
                offset: 0,
                row_stride: 64,
                rows: 64,
            },
            cos_sin_dtype: DType::F32,
            weight_offset: 0,
            weight_dtype: DType::F32,
            cache: IndexerKCache {
                offset: 0,
                block_stride: 64 * format.record_bytes(),
                blocks: 1,
                block_size: 64,
                format,
                order: IndexerKOrder::RowMajor,
                mx_scale: false,
            },
        }
    }

    /// A fused plan of `n` tokens in `reqs` requests (CR2 when `reqs > 0`)
    /// with the given weight and table types; only what the launch reads
    /// is meaningful.
    fn fused_plan(n: usize, reqs: usize, layout: RecordLayout, w: DType, cs: DType) -> FusedPlan {
        use crate::layout::RecordOrder;
        use crate::ops::{CachePlan, IndexPlan, RingPlan, RowsPlan};
        let rows = RowsPlan {
            offset: 0,
            row_stride: 512,
            rows: n,
        };
        let index = |len| IndexPlan {
            offset: 0,
            is_i64: false,
            len,
        };
        let cr2 = reqs > 0;
        let compress = CompressPlan {
            n,
            compress_ratio: if cr2 { 2 } else { 1 },
            eps: 1e-6,
            kv_score: rows,
            positions: index(n),
            slots: index(n),
            weight_offset: 0,
            weight_dtype: w,
            latent: rows,
            ring: cr2.then_some(RingPlan {
                offset: 0,
                block_stride: 1024,
                row_stride: 1024,
                blocks: 1,
                capacity: 1,
            }),
            query_start_loc: cr2.then(|| index(reqs + 1)),
            token_to_req: cr2.then(|| index(n)),
            prev_rows: None,
            prev_row_indices: None,
        };
        FusedPlan {
            insert: InsertPlan {
                n,
                compress_ratio: compress.compress_ratio,
                latent: rows,
                positions: index(n),
                slots: index(n),
                cos_sin: rows,
                cos_sin_dtype: cs,
                cache: CachePlan {
                    layout,
                    offset: 0,
                    block_stride: 0,
                    row_stride: 0,
                    blocks: 1,
                    block_size: 1,
                    order: RecordOrder::PagePlanar,
                },
                fp8_scale_offset: None,
            },
            compress,
            write_latent: true,
        }
    }

    #[test]
    fn other_input_dtypes_run_the_generic_kernels_and_bf16_weights_the_tuned_ones() {
        const D: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
        for (_, pol) in LaunchPolicy::MAPPINGS {
            for l in RecordLayout::ALL {
                for (n, reqs) in [(1usize, 0usize), (1 << 16, 0), (1, 1), (8, 4), (1 << 16, 4)] {
                    let cr = if reqs > 0 { 2 } else { 1 };
                    for w in D {
                        for cs in D {
                            let p = fused_plan(n, reqs, l, w, cs);
                            let items = compress_items(&p.compress);
                            let bf16_f32 = fused_plan(n, reqs, l, DType::BF16, DType::F32);
                            let (fused, compress, insert) = (
                                pol.fused_launch(&p),
                                pol.compress_launch(&p.compress),
                                pol.insert_launch(&p.insert),
                            );
                            let wide_w = w != DType::BF16;
                            let wide_cs = cs == DType::F16;
                            if wide_w || wide_cs {
                                assert_eq!(fused.kernel, fused_wide_kernel(cr, l));
                                assert_eq!(fused.geometry, pol.geometry(items));
                            } else {
                                // BF16 weights with F32 or BF16 tables: the
                                // tuned choice, the same for both tables.
                                assert!(!fused.kernel.name().ends_with("_wide"));
                                assert_eq!(fused, pol.fused_launch(&bf16_f32));
                            }
                            if wide_w {
                                assert_eq!(compress.kernel, compress_wide_kernel(cr));
                                assert_eq!(compress.geometry, pol.geometry(items));
                            } else {
                                assert!(!compress.kernel.name().ends_with("_wide"));
                            }
                            if wide_cs {
                                assert_eq!(insert.kernel, insert_wide_kernel(l));
                                assert_eq!(insert.geometry, pol.geometry(n as u64));
                            } else {
                                assert!(!insert.kernel.name().ends_with("_wide"));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn large_cr1_inserts_run_tile_major_where_the_layout_has_it() {
        for pol in [
            M,
            LaunchPolicy {
                insert_tiles: Some(true),
                ..M
            },
        ] {
            // CR2 never, forced or not: the kernels skip the compress-ratio test.
            assert!(!pol.insert_uses_tiles(2, 1 << 20));
            assert!(!pol.insert_uses_tiles(2, 1));
        }
        assert!(!M.insert_uses_tiles(1, SMALL_LAUNCH_ITEMS));
        assert!(M.insert_uses_tiles(1, SMALL_LAUNCH_ITEMS + 1));
        let off = LaunchPolicy {
            insert_tiles: Some(false),
            ..M
        };
        assert!(!off.insert_uses_tiles(1, 1 << 20));
        assert_eq!(insert_tiles_kernel(RecordLayout::V4), None);
        assert_eq!(insert_tiles_kernel(RecordLayout::Mxfp8), None);
        for l in [
            RecordLayout::Nvfp4,
            RecordLayout::Bf16Rows,
            RecordLayout::Fp8Rows,
        ] {
            assert!(insert_tiles_kernel(l).is_some());
        }
    }

    #[test]
    fn large_multi_token_compresses_spread_their_token_blocks() {
        // Two-token decode: `n` tokens in n / 2 requests, screened from
        // CR2_SCREEN_MIN_ITEMS_MULTI items, spread from CR2_SPREAD_MIN_ITEMS.
        let two = |pol: &LaunchPolicy, n: u64, fused: bool| pol.cr2_shape(n, n / 2, fused);
        let at = |items: u64| items / 3 * 2; // tokens of `items` items
        let s = two(&M, at(CR2_SPREAD_MIN_ITEMS), false);
        assert!(s.multi_token && s.spread && s.tokens == TokenBlocks::Screened);
        assert_eq!(s.items, Cr2Items::Pairs);
        assert_eq!(compress_cr2_kernel(2, s), Kernel::CompressCr2PairMtpSpread);
        let s = two(&M, at(CR2_SPREAD_MIN_ITEMS) - 2, false);
        assert!(s.multi_token && !s.spread);
        assert_eq!(s.items, Cr2Items::Teams);
        assert_eq!(compress_cr2_kernel(2, s), Kernel::CompressCr2TeamMtp);
        // Forced pairs spread too; forced teams never do.
        let pairs = LaunchPolicy {
            cr2_items: Some(Cr2Items::Pairs),
            ..M
        };
        let s = two(&pairs, 1 << 17, false);
        assert!(s.spread && s.items == Cr2Items::Pairs);
        assert!(!two(&pairs, at(CR2_SPREAD_MIN_ITEMS) - 2, false).spread);
        // Fused launches, one-token decode (swept), long chunks and forced
        // teams never spread, forced or not; forced off, nothing spreads.
        let on = LaunchPolicy {
            cr2_spread: Some(true),
            ..M
        };
        let off = LaunchPolicy {
            cr2_spread: Some(false),
            ..M
        };
        for pol in [M, on] {
            assert!(!two(&pol, 1 << 17, true).spread);
            assert!(!pol.cr2_shape(1 << 17, 1 << 17, false).spread);
            assert!(!pol.cr2_shape(1 << 17, 4, false).spread);
            let teams = LaunchPolicy {
                cr2_items: Some(Cr2Items::Teams),
                ..pol
            };
            let s = two(&teams, 1 << 17, false);
            assert!(!s.spread && s.items == Cr2Items::Teams);
            assert_eq!(compress_cr2_kernel(2, s), Kernel::CompressCr2TeamMtp);
        }
        assert!(!two(&off, 1 << 17, false).spread);
        // Forced on, a screened multi-token launch spreads (in pairs) at any
        // size; an unscreened one has no token blocks to spread.
        let screened_on = LaunchPolicy {
            cr2_screen: Some(true),
            ..on
        };
        assert!(two(&screened_on, 8, false).spread);
        assert!(!two(&on, 8, false).spread);
        // The variable.
        let env = |v: &'static str| {
            LaunchPolicy::from_lookup(move |k| (k == "DSV4_KVCACHE_CR2_SPREAD").then(|| v.into()))
        };
        assert_eq!(env("1").unwrap(), on);
        assert_eq!(env("0").unwrap(), off);
    }

    #[test]
    fn large_cr1_inserts_run_the_32_register_kernels_where_the_layout_has_them() {
        // fused_plan's insert: CR2 when it has requests.
        let plan = |layout, compress_ratio, n: u64| {
            let reqs = if compress_ratio == 2 { 1 } else { 0 };
            fused_plan(n as usize, reqs, layout, DType::BF16, DType::F32).insert
        };
        let forced = LaunchPolicy {
            insert_large: Some(true),
            ..M
        };
        for l in RecordLayout::ALL {
            let large = insert_large_kernel(l);
            assert_eq!(
                large.is_some(),
                matches!(l, RecordLayout::V4 | RecordLayout::Mxfp8)
            );
            for (pol, cr, n, want_large) in [
                (M, 1, LARGE_INSERT_TOKENS, false),
                (M, 1, LARGE_INSERT_TOKENS + 1, true),
                (M, 2, 1 << 20, false),
                (forced, 1, 1, true),
                (forced, 2, 1, false),
                (
                    LaunchPolicy {
                        insert_large: Some(false),
                        ..M
                    },
                    1,
                    1 << 20,
                    false,
                ),
            ] {
                let got = pol.insert_launch(&plan(l, cr, n));
                let want = match (insert_tiles_kernel(l), pol.insert_uses_tiles(cr, n)) {
                    (Some(t), true) => t,
                    _ => large.filter(|_| want_large).unwrap_or(insert_kernel(l)),
                };
                assert_eq!(got.kernel, want, "{l:?} cr {cr} n {n}");
                // Same geometry as the 40-register kernel: a token per group.
                if Some(got.kernel) == large {
                    assert_eq!(got.geometry, pol.geometry(n));
                }
            }
        }
    }

    /// The thread-to-tile map of `kv_tile_of_thread_runs` (kernels-hip/kv_insert.hip).
    fn tile_of_thread_runs(groups_log2: u32, block: u32, thread: u32) -> (u64, u32) {
        let i = (u64::from(block) << (5 + groups_log2)) + u64::from(thread);
        let j = (i & 255) as u32;
        let (tok, tile) = if j < 224 {
            (j / 28, j % 28)
        } else {
            ((j - 224) >> 2, 28 + (j & 3))
        };
        ((i >> 8) * TILE_RUN_TOKENS + u64::from(tok), tile)
    }

    #[test]
    fn nvfp4_tile_major_launches_cover_every_tile_once_with_one_kind_per_warp() {
        for forced in [None, Some(2), Some(4), Some(8)] {
            let pol = LaunchPolicy {
                groups_per_block: forced,
                insert_tiles: Some(true),
                ..M
            };
            for n in [1u64, 2, 7, 8, 9, 31, 32, 33, 100, 2049, 4100] {
                let g = tiles_geometry(Kernel::InsertNvfp4Tiles, pol.geometry(n), n);
                let mut seen = vec![0u8; n as usize * 32];
                for b in 0..g.grid {
                    for w in (0..g.block_threads).step_by(32) {
                        let mut kinds = std::collections::HashSet::new();
                        for i in w..w + 32 {
                            let (t, tile) = tile_of_thread_runs(g.groups_log2, b, i);
                            kinds.insert(tile >= 28);
                            if t < n {
                                seen[t as usize * 32 + tile as usize] += 1;
                            }
                        }
                        assert_eq!(kinds.len(), 1, "block {b}: a warp mixes NoPE and RoPE");
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "n = {n}: a tile missed or repeated"
                );
                // Whole runs, none past the last token's.
                let threads = u64::from(g.grid) * u64::from(g.block_threads);
                assert_eq!(threads, 256 * n.div_ceil(TILE_RUN_TOKENS));
            }
            // The other tile-major inserts keep the plain geometry.
            for k in [Kernel::InsertBf16Tiles, Kernel::InsertFp8Tiles] {
                assert_eq!(
                    tiles_geometry(k, pol.geometry(4100), 4100),
                    pol.geometry(4100)
                );
            }
        }
    }

    #[test]
    fn team_launches_are_one_block_of_whole_wavefronts_per_item() {
        for groups in [CR2_TEAM_GROUPS, CR2_PAIR_GROUPS] {
            for items in [1u64, 2, 33, 1 << 20] {
                let g = team_geometry(items, groups);
                assert_eq!(g.grid as u64, items);
                assert_eq!(g.block_threads, GROUP_LANES * groups);
                assert_eq!(1u32 << g.groups_log2, groups);
                assert_eq!(g.block_threads % 64, 0);
                assert!(g.block_threads <= BLOCK_THREADS);
            }
        }
        use Cr2Items::*;
        for fused in [false, true] {
            let items = |n, reqs| M.cr2_shape(n, reqs, fused).items;
            // Decode batches of one-token requests: teams, then pairs.
            let one_token = |t: u64| items(t, t);
            assert_eq!(one_token(1), Teams);
            assert_eq!(one_token(CR2_TEAM_MAX_ITEMS / 2), Teams);
            assert_eq!(one_token(CR2_TEAM_MAX_ITEMS / 2 + 1), Pairs);
            assert_eq!(one_token(1 << 16), Pairs);
            assert_eq!(items(5000, 4000), Pairs);
            // Other decode batches (half the tokens start a chunk): teams
            // at every size, but the plain compressor's spread launches
            // (from CR2_SPREAD_MIN_ITEMS items), which run pairs.
            assert_eq!(items(4000, 2000), Teams);
            assert_eq!(items(8000, 4000), Teams);
            assert_eq!(items(16382, 8191), Teams);
            let spread = if fused { Teams } else { Pairs };
            assert_eq!(items(16384, 8192), spread);
            assert_eq!(items(1 << 16, 1 << 15), spread);
            // Long chunks: teams up to their limit, then (fused) lone
            // groups, then lone groups by halves; never pairs.
            assert_eq!(items(16, 4), Teams);
            assert_eq!(items(1020, 4), Teams);
            assert_eq!(items(2556, 4), Teams);
            if fused {
                assert_eq!(items(2557, 4), Lone);
                assert_eq!(items(3068, 4), Lone);
                assert_eq!(items(3069, 4), LoneHalves);
            } else {
                assert_eq!(items(4096, 4), Teams);
                assert_eq!(items(4097, 4), LoneHalves);
            }
            assert_eq!(items(4000, 1999), LoneHalves);
            assert_eq!(items(16384, 4), LoneHalves);
            // A forced mapping wins at every size.
            for forced in [Lone, Teams, Pairs, LoneHalves] {
                let pol = LaunchPolicy {
                    cr2_items: Some(forced),
                    ..M
                };
                for (n, reqs) in [(1u64, 1u64), (1 << 16, 4), (1 << 16, 1 << 16)] {
                    assert_eq!(pol.cr2_shape(n, reqs, fused).items, forced);
                }
            }
        }
    }

    #[test]
    fn geometry_covers_every_item_with_whole_wavefronts() {
        for forced in [None, Some(2), Some(4), Some(8)] {
            let pol = LaunchPolicy {
                groups_per_block: forced,
                ..M
            };
            for items in [0u64, 1, 2, 3, 16, 2047, 2048, 2049, 65536, 1 << 24] {
                let g = pol.geometry(items);
                let gpb = 1u64 << g.groups_log2;
                assert_eq!(g.block_threads as u64, gpb * GROUP_LANES as u64);
                assert_eq!(
                    g.block_threads % 64,
                    0,
                    "a block is whole 64-lane wavefronts"
                );
                assert!(
                    g.block_threads <= BLOCK_THREADS,
                    "kernels are built for at most {BLOCK_THREADS}"
                );
                assert!(g.grid >= 1);
                // Every item has a group, and no block is wholly idle.
                assert!(g.grid as u64 * gpb >= items);
                assert!((g.grid as u64 - 1) * gpb < items.max(1));
                let measured = if items <= SMALL_LAUNCH_ITEMS {
                    SMALL_GROUPS_PER_BLOCK
                } else {
                    GROUPS_PER_BLOCK
                };
                assert_eq!(gpb, forced.unwrap_or(measured) as u64);
            }
        }
    }

    #[test]
    fn screened_team_launches_cover_every_request_and_token() {
        for groups in [CR2_TEAM_GROUPS, CR2_PAIR_GROUPS] {
            for (n, reqs) in [
                (1u64, 1u64),
                (512, 512),
                (513, 500),
                (1 << 14, 1 << 14),
                (4097, 1),
            ] {
                for tokens in [TokenBlocks::Screened, TokenBlocks::Swept] {
                    let g = screened_team_geometry(n, reqs, groups, tokens);
                    assert_eq!(g.token_blocks, tokens);
                    assert_eq!(g.block_threads, GROUP_LANES * groups);
                    // A block per request, then one per `groups` tokens
                    // (screened) or per lane (swept); none wholly idle.
                    let per = if tokens == TokenBlocks::Swept {
                        g.block_threads as u64
                    } else {
                        groups as u64
                    };
                    let token_blocks = g.grid as u64 - reqs;
                    assert!(token_blocks * per >= n);
                    assert!((token_blocks - 1) * per < n);
                    // A pooled buffer per group, then a closing position per
                    // token (kv_cr2_token_block: one per group), 8-byte
                    // aligned, and for a swept block (kv_cr2_token_sweep:
                    // one per lane) a flag per group.
                    assert_eq!((groups * CR2_POOLED_BYTES) % 8, 0);
                    if tokens == TokenBlocks::Screened {
                        assert_eq!(g.shared_bytes, groups * (CR2_POOLED_BYTES + 8));
                    } else {
                        assert_eq!(
                            g.shared_bytes,
                            groups * CR2_POOLED_BYTES + 8 * g.block_threads + 4 * groups
                        );
                    }
                }
            }
            assert_eq!(team_geometry(7, groups).shared_bytes, CR2_POOLED_BYTES);
        }
        assert_eq!(M.geometry(7).shared_bytes, 0);
        for fused in [false, true] {
            let screens = |n, reqs| {
                matches!(
                    M.cr2_shape(n, reqs, fused).tokens,
                    TokenBlocks::Screened | TokenBlocks::Swept
                )
            };
            // Swept where there are no more tokens than requests, else
            // screened (the plain compressor only).
            let sweeps = |n, reqs| M.cr2_shape(n, reqs, fused).tokens == TokenBlocks::Swept;
            assert_eq!(sweeps(256, 256), !fused);
            assert_eq!(sweeps(1 << 16, 1 << 16), !fused);
            assert_eq!(sweeps(300, 400), !fused);
            assert!(!sweeps(260, 252) && !sweeps(1250, 1000) && !sweeps(255, 255));
            // One-token requests from 512 items (256 tokens) on.
            assert!(!screens(255, 255));
            assert!(screens(256, 256));
            assert!(screens(1 << 16, 1 << 16));
            // At most one request in four with a second token: from 512
            // items.
            assert!(screens(1250, 1000));
            assert!(screens(260, 252));
            assert!(!screens(256, 255));
            // Other decode batches from 1536 items on.
            assert!(screens(1251, 1000));
            assert!(screens(1024, 512));
            assert!(screens(2048, 1024));
            assert!(screens(8000, 4000));
            assert!(!screens(1022, 511));
            assert!(!screens(400, 300));
            // Long chunks in screened teams above 1540 items, up to 2560
            // (the plain compressor: 4100); lone groups never screen.
            let unscreened = CR2_TEAM_MAX_ITEMS_LONG_CHUNKS;
            let teams = if fused {
                CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS
            } else {
                CR2_CHUNK_TEAM_MAX_ITEMS
            };
            assert!(!screens(unscreened - 4, 4));
            assert!(screens(unscreened - 3, 4));
            assert!(screens(teams - 4, 4));
            assert!(!screens(teams - 3, 4));
            assert!(!screens(1 << 16, 4));
        }
        // The plain compressor's long chunks run their own team kernel,
        // screened or not; decode batches never do.
        let kernel = |n, reqs| compress_cr2_kernel(2, M.cr2_shape(n, reqs, false));
        for (n, reqs) in [(16u64, 4u64), (1536, 4), (2048, 4), (4096, 4), (6, 2)] {
            assert_eq!(kernel(n, reqs), Kernel::CompressCr2TeamChunks, "{n} tokens");
        }
        assert_eq!(kernel(8192, 4), Kernel::CompressCr2Long);
        // Unscreened, their token blocks cover two tokens; nothing else's do.
        let two = |n, reqs, fused| M.cr2_shape(n, reqs, fused).tokens == TokenBlocks::TwoTokens;
        let min = CR2_TWO_TOKEN_MIN_ITEMS;
        assert!(two(min - 4, 4, false) && two(1536, 4, false));
        assert!(!two(min - 5, 4, false) && !two(16, 4, false) && !two(6, 2, false));
        assert!(!two(2048, 4, false) && !two(1536, 4, true) && !two(16, 16, false));
        for (n, reqs) in [(1u64, 1u64), (1535, 4), (1536, 4), (7, 3)] {
            let g = two_token_geometry(n, reqs, CR2_TEAM_GROUPS);
            assert_eq!(g.grid as u64, reqs + n.div_ceil(2));
            assert_eq!(g.shared_bytes, CR2_POOLED_BYTES);
            assert_eq!(g.token_blocks.tokens_per_block(CR2_TEAM_GROUPS), 2);
        }
        assert_eq!(kernel(2048, 1024), Kernel::CompressCr2TeamMtp);
        assert_eq!(kernel(16, 16), Kernel::CompressCr2Team);
        // The multi-token kernels: screened launches that are not mostly
        // one-token requests (fused ones in teams).
        for fused in [false, true] {
            let mtp = |n, reqs| M.cr2_shape(n, reqs, fused).multi_token;
            assert!(mtp(1024, 512));
            assert!(mtp(1 << 16, 1 << 15));
            // (Long chunks of the plain compressor run their own kernel.)
            assert_eq!(mtp(2048, 4), fused);
            assert!(!mtp(1022, 511));
            assert!(!mtp(1 << 14, 1 << 14));
            assert!(!mtp(1250, 1000));
            assert!(!mtp(4096, 4));
        }
        // Lone groups never screen, whatever is asked.
        for pol in LaunchPolicy::MAPPINGS.map(|(_, p)| p) {
            for (n, reqs) in [(1u64, 1u64), (1 << 16, 4), (2000, 1500), (1 << 16, 1 << 16)] {
                for fused in [false, true] {
                    let s = pol.cr2_shape(n, reqs, fused);
                    assert!(
                        matches!(s.items, Cr2Items::Teams | Cr2Items::Pairs)
                            || s.tokens == TokenBlocks::Items
                    );
                    assert!(s.long_chunks || s.tokens != TokenBlocks::TwoTokens);
                    assert!(s.tokens == TokenBlocks::Screened || !s.multi_token);
                    // The fused kernels have no swept token blocks.
                    assert!(!fused || s.tokens != TokenBlocks::Swept);
                }
            }
        }
        // Forced screening applies to teams and pairs at every size.
        let on = LaunchPolicy {
            cr2_screen: Some(true),
            ..M
        };
        assert_eq!(on.cr2_shape(1, 1, false).tokens, TokenBlocks::Swept);
        assert_eq!(on.cr2_shape(3, 2, false).tokens, TokenBlocks::Screened);
        let off = LaunchPolicy {
            cr2_screen: Some(false),
            ..M
        };
        assert_eq!(
            off.cr2_shape(1 << 16, 1 << 16, false).tokens,
            TokenBlocks::Items
        );
    }
}
