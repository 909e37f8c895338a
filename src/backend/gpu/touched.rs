//! What a failed launch, or a failed wait for launched work, may have
//! written ([`crate::Touched`]): each launched call's written tensors and
//! the index tensor naming their rows, taken from its plan. A failed launch
//! reads its index values back (the call's tensors are still borrowed); the
//! safe API keeps its calls per stream until the stream is waited for, so a
//! failed wait names theirs (values unread: the tensors may be gone).

use super::bind::DevAddr;
use super::{Driver, GpuBackend};
use crate::backend::raw::RawStream;
use crate::error::{Error, IndexValues, Result, Rows, Touched, TouchedRows};
use crate::gather::GatherPlan;
use crate::indexer_k::IndexerKPlan;
use crate::ops::{
    Bound, CompressPlan, CompressTensors, FusedPlan, FusedTensors, IndexPlan, IndexerKTensors,
    InsertPlan, InsertTensors, RingRowsPlan, RingTensors,
};
use std::sync::{Mutex, MutexGuard};

/// Calls a backend keeps for a failed wait; further ones are only counted.
const KEPT_CALLS: usize = 64;

/// One written tensor of a call.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// The rows named by the first `count` entries of the index tensor at
    /// device address `addr`.
    Indexed {
        tensor: &'static str,
        index: &'static str,
        addr: u64,
        is_i64: bool,
        count: usize,
    },
    /// Rows `0..end`.
    Leading { tensor: &'static str, end: usize },
}

/// A launched call's written tensors (no allocation: kept per launch).
#[derive(Debug, Clone, Copy)]
pub(super) struct CallRows {
    op: &'static str,
    parts: [Option<Part>; 3],
}

fn indexed<S: DevAddr>(
    tensor: &'static str,
    b: &Bound<'_, S>,
    p: &IndexPlan,
    count: usize,
) -> Option<Part> {
    Some(Part::Indexed {
        tensor,
        index: b.arg,
        addr: b.buf.map_or(0, |s| s.addr()) + p.offset as u64,
        is_i64: p.is_i64,
        count,
    })
}

/// The CR2 compressor's ring store (without predecessor rows): the ring
/// rows its slots name.
fn ring_store<S: DevAddr>(p: &CompressPlan, t: &CompressTensors<Bound<'_, S>>) -> Option<Part> {
    (p.ring.is_some() && p.prev_rows.is_none())
        .then(|| indexed("state_cache", &t.slot_mapping, &p.slots, p.n))
        .flatten()
}

impl CallRows {
    /// A call that launched nothing.
    pub(super) const NONE: CallRows = CallRows {
        op: "",
        parts: [None; 3],
    };

    pub(super) fn insert<S: DevAddr>(p: &InsertPlan, t: &InsertTensors<Bound<'_, S>>) -> Self {
        CallRows {
            op: "rope_quant_insert",
            parts: [
                indexed("kv_cache", &t.slot_mapping, &p.slots, p.n),
                None,
                None,
            ],
        }
    }

    pub(super) fn indexer_k<S: DevAddr>(
        p: &IndexerKPlan,
        t: &IndexerKTensors<Bound<'_, S>>,
    ) -> Self {
        CallRows {
            op: "indexer_k_norm_rope_store",
            parts: [
                indexed("k_cache", &t.kv_slot_mapping, &p.slots, p.n),
                None,
                None,
            ],
        }
    }

    pub(super) fn ring<S: DevAddr>(p: &RingRowsPlan, t: &RingTensors<Bound<'_, S>>) -> Self {
        CallRows {
            op: "save_ring_rows",
            parts: [
                indexed("state_cache", &t.slot_mapping, &p.slots, p.n),
                None,
                None,
            ],
        }
    }

    pub(super) fn compress<S: DevAddr>(
        p: &CompressPlan,
        t: &CompressTensors<Bound<'_, S>>,
    ) -> Self {
        CallRows {
            op: "fused_save_compress_norm",
            parts: [
                Some(Part::Leading {
                    tensor: "latent_out",
                    end: p.n,
                }),
                ring_store(p, t),
                None,
            ],
        }
    }

    pub(super) fn fused<S: DevAddr>(p: &FusedPlan, t: &FusedTensors<Bound<'_, S>>) -> Self {
        let c = &p.compress;
        CallRows {
            op: "fused_compress_insert",
            parts: [
                p.write_latent.then_some(Part::Leading {
                    tensor: "latent_out",
                    end: c.n,
                }),
                ring_store(c, &t.compress),
                indexed(
                    "kv_cache",
                    &t.insert.cache_slot_mapping,
                    &p.insert.slots,
                    c.n,
                ),
            ],
        }
    }

    pub(super) fn gather(p: &GatherPlan) -> Self {
        CallRows {
            op: "gather_dequant",
            parts: [
                Some(Part::Leading {
                    tensor: "out",
                    end: p.n,
                }),
                None,
                None,
            ],
        }
    }

    fn is_empty(&self) -> bool {
        self.parts.iter().all(Option::is_none)
    }

    /// The rows, with the index values `read` gives.
    fn rows<'a>(
        &self,
        read: &'a mut dyn FnMut(u64, bool, usize) -> IndexValues,
    ) -> impl Iterator<Item = TouchedRows> + 'a {
        let op = self.op;
        let mut parts = self.parts.into_iter().flatten();
        std::iter::from_fn(move || {
            let (tensor, rows) = match parts.next()? {
                Part::Leading { tensor, end } => (tensor, Rows::Leading { end }),
                Part::Indexed {
                    tensor,
                    index,
                    addr,
                    is_i64,
                    count,
                } => (
                    tensor,
                    Rows::Indexed {
                        index,
                        count,
                        values: read(addr, is_i64, count),
                    },
                ),
            };
            Some(TouchedRows { op, tensor, rows })
        })
    }
}

/// The safe API's calls launched and not yet waited for, by stream.
#[derive(Debug, Default)]
pub(super) struct PendingCalls {
    kept: Vec<(RawStream, CallRows)>,
    /// Calls past [`KEPT_CALLS`], counted by stream.
    more: Vec<(RawStream, usize)>,
}

impl<D: Driver> GpuBackend<D> {
    fn pending(&self) -> MutexGuard<'_, PendingCalls> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `call`, launched on `stream` by the safe API, until the stream
    /// is waited for.
    pub(super) fn launched(&self, stream: RawStream, call: CallRows) {
        if call.is_empty() {
            return;
        }
        let mut p = self.pending();
        if p.kept.len() < KEPT_CALLS {
            p.kept.push((stream, call));
        } else if let Some(m) = p.more.iter_mut().find(|m| m.0 == stream) {
            m.1 += 1;
        } else {
            p.more.push((stream, 1));
        }
    }

    /// The outcome `r` of waiting for `stream` (or of a copy on it): the
    /// calls kept for it are done with, and a failure names their rows.
    pub(super) fn settle(&self, stream: RawStream, r: Result<()>) -> Result<()> {
        let mut p = self.pending();
        let mut touched = Touched::default();
        p.kept.retain(|(s, call)| {
            let mine = *s == stream;
            if mine && r.is_err() {
                touched
                    .rows
                    .extend(call.rows(&mut |_, _, _| IndexValues::Unread));
            }
            !mine
        });
        if let Some(i) = p.more.iter().position(|m| m.0 == stream) {
            touched.more_calls = p.more.swap_remove(i).1;
        }
        r.map_err(|e| e.touching(touched))
    }

    /// The error `e` of launching `call` on `stream`, with the rows the call
    /// may have written: its index values read back after waiting for the
    /// stream, where the device still answers.
    ///
    /// # Safety
    /// The call's index tensors hold their planned entries at the addresses
    /// `call` names, still allocated (the failed call borrows them).
    pub(super) unsafe fn launch_failed(
        &self,
        e: Error,
        call: CallRows,
        stream: RawStream,
    ) -> Error {
        let mut read = |addr: u64, is_i64: bool, count: usize| {
            let width = if is_i64 { 8 } else { 4 };
            let mut bytes = vec![0u8; count * width];
            let ok = self.drv.synchronize(stream).is_ok()
                && self.drv.copy_to_host(&mut bytes, addr, stream).is_ok()
                && self.drv.synchronize(stream).is_ok();
            if !ok {
                return IndexValues::Unread;
            }
            let plan = IndexPlan {
                offset: 0,
                is_i64,
                len: count,
            };
            IndexValues::of((0..count).map(|i| plan.read(&bytes, i)))
        };
        let rows = call.rows(&mut read).collect();
        e.touching(Touched {
            rows,
            more_calls: 0,
        })
    }
}

/// A fresh log.
pub(super) fn new_log() -> Mutex<PendingCalls> {
    Mutex::new(PendingCalls::default())
}
