//! The library's error type.

use thiserror::Error;

/// Everything that can go wrong, each variant naming what was wrong and what
/// was expected. Invalid arguments are always reported before anything is
/// written.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument has the wrong element type.
    #[error("{arg}: dtype {got}, expected {expected}")]
    DType {
        /// Argument name, as in the seed's signature.
        arg: &'static str,
        /// What was given.
        got: String,
        /// What is accepted (`"I32 or I64"`).
        expected: String,
    },
    /// An argument has the wrong shape, rank, stride or alignment.
    #[error("{arg}: {problem}")]
    Shape {
        /// Argument name.
        arg: &'static str,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// A tensor view reaches past the end of its buffer.
    #[error("{arg}: view needs {needed} bytes of its buffer, which has {available}")]
    OutOfBounds {
        /// Argument name.
        arg: &'static str,
        /// Bytes the view's last element ends at.
        needed: u64,
        /// Bytes in the buffer.
        available: u64,
    },
    /// A scalar argument is out of its domain.
    #[error("{arg}: {problem}")]
    Value {
        /// Argument name.
        arg: &'static str,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// A required optional argument is missing, or a forbidden one given.
    #[error("{arg}: {problem}")]
    Missing {
        /// Argument name.
        arg: &'static str,
        /// Why it is needed (or not allowed).
        problem: &'static str,
    },
    /// The backend cannot run: no driver, no device, or no kernels embedded.
    #[error("{backend} backend unavailable: {reason}")]
    Unavailable {
        /// `cuda` or `hip`.
        backend: &'static str,
        /// What was looked for and how to fix it.
        reason: String,
    },
    /// A driver or runtime call failed. Where it was a launch, or a wait for
    /// launched work, after the arguments were accepted, `touched` names the
    /// rows that the calls may have written; every other row of the written
    /// tensors is as it was.
    #[error("{backend}: {call} failed: {message}{touched}")]
    Driver {
        /// `cuda` or `hip`.
        backend: &'static str,
        /// The API call.
        call: &'static str,
        /// The driver's message.
        message: String,
        /// What the failed launches may have written (empty for calls that
        /// write no tensor).
        touched: Touched,
    },
    /// A test-vector file could not be read or is malformed.
    #[error("test vectors: {0}")]
    Vectors(String),
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Driver`] that touched nothing.
    pub fn driver(backend: &'static str, call: &'static str, message: impl Into<String>) -> Error {
        Error::Driver {
            backend,
            call,
            message: message.into(),
            touched: Touched::default(),
        }
    }

    /// `self` with `touched` added, when it is an [`Error::Driver`].
    pub fn touching(mut self, more: Touched) -> Error {
        if let Error::Driver { touched, .. } = &mut self {
            touched.rows.extend(more.rows);
            touched.more_calls += more.more_calls;
        }
        self
    }
}

/// The rows that failed device calls may have written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Each written tensor of each call, in launch order.
    pub rows: Vec<TouchedRows>,
    /// Further calls whose rows are not listed (a long queue of launches
    /// waited for at once).
    pub more_calls: usize,
}

impl Touched {
    /// Whether nothing may have been written.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.more_calls == 0
    }
}

/// Rows of one written tensor that a failed call may have written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TouchedRows {
    /// The operation (`rope_quant_insert`, ...).
    pub op: &'static str,
    /// The written tensor (`kv_cache`, `state_cache`, `latent_out`, `out`).
    pub tensor: &'static str,
    /// Which of its rows.
    pub rows: Rows,
}

/// How the rows of a [`TouchedRows`] are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// The rows (cache slots `block * block_size + row`, or ring rows
    /// `block * capacity + row`) that the first `count` entries of the index
    /// tensor `index` name.
    Indexed {
        /// The index tensor (`slot_mapping`, `cache_slot_mapping`).
        index: &'static str,
        /// Entries used.
        count: usize,
        /// Their values, where they were read.
        values: IndexValues,
    },
    /// Rows `0..end` of the tensor (one per token, or per output row).
    Leading {
        /// One past the last row.
        end: usize,
    },
}

/// The entries of an index tensor, as far as they were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexValues {
    /// Not read (the device could not be read, or the tensor may be gone).
    Unread,
    /// Every entry is negative: no row is written.
    AllSkipped,
    /// The least and the greatest non-negative entry (entries past the
    /// tensor's rows are skipped, not written).
    Range {
        /// Least non-negative entry.
        lo: i64,
        /// Greatest entry.
        hi: i64,
    },
}

impl IndexValues {
    /// The range of the non-negative values of `entries`.
    pub fn of(entries: impl IntoIterator<Item = i64>) -> IndexValues {
        entries
            .into_iter()
            .filter(|&v| v >= 0)
            .fold(IndexValues::AllSkipped, |acc, v| match acc {
                IndexValues::Range { lo, hi } => IndexValues::Range {
                    lo: lo.min(v),
                    hi: hi.max(v),
                },
                _ => IndexValues::Range { lo: v, hi: v },
            })
    }
}

impl std::fmt::Display for TouchedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (op, tensor) = (self.op, self.tensor);
        match self.rows {
            Rows::Leading { end } => write!(f, "{op} {tensor} rows 0..{end}"),
            Rows::Indexed {
                index,
                count,
                values,
            } => {
                write!(f, "{op} {tensor} rows named by {index}[0..{count}]")?;
                match values {
                    IndexValues::Unread => write!(f, " (values not read)"),
                    IndexValues::AllSkipped => write!(f, " (all negative: none)"),
                    IndexValues::Range { lo, hi } => write!(f, ", within {lo}..={hi}"),
                }
            }
        }
    }
}

impl std::fmt::Display for Touched {
    /// Empty when nothing may have been written; else `; may have written: `
    /// and the rows, `; ` between them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return Ok(());
        }
        write!(f, "; may have written: ")?;
        for (i, r) in self.rows.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{r}")?;
        }
        if self.more_calls > 0 {
            let sep = if self.rows.is_empty() { "" } else { "; " };
            write!(f, "{sep}the rows of {} more calls", self.more_calls)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_name_the_rows_they_may_have_written() {
        let e = Error::driver("hip", "hipStreamSynchronize", "hipErrorLaunchFailure");
        assert_eq!(
            e.to_string(),
            "hip: hipStreamSynchronize failed: hipErrorLaunchFailure"
        );
        let insert = TouchedRows {
            op: "rope_quant_insert",
            tensor: "kv_cache",
            rows: Rows::Indexed {
                index: "slot_mapping",
                count: 12,
                values: IndexValues::of([7, -1, 300, 3]),
            },
        };
        let compress = TouchedRows {
            op: "fused_save_compress_norm",
            tensor: "latent_out",
            rows: Rows::Leading { end: 12 },
        };
        let ring = TouchedRows {
            op: "save_ring_rows",
            tensor: "state_cache",
            rows: Rows::Indexed {
                index: "slot_mapping",
                count: 2,
                values: IndexValues::Unread,
            },
        };
        let e = e.touching(Touched {
            rows: vec![insert, compress, ring],
            more_calls: 0,
        });
        assert_eq!(
            e.to_string(),
            "hip: hipStreamSynchronize failed: hipErrorLaunchFailure; may have written: \
             rope_quant_insert kv_cache rows named by slot_mapping[0..12], within 3..=300; \
             fused_save_compress_norm latent_out rows 0..12; \
             save_ring_rows state_cache rows named by slot_mapping[0..2] (values not read)"
        );
        let e = e.touching(Touched {
            rows: vec![],
            more_calls: 5,
        });
        assert!(
            e.to_string()
                .ends_with("(values not read); the rows of 5 more calls"),
            "{e}"
        );
        assert_eq!(IndexValues::of([-1, -5]), IndexValues::AllSkipped);
        // Only driver errors carry rows.
        let v = Error::Vectors("x".into());
        assert_eq!(
            v.clone().touching(Touched {
                rows: vec![insert],
                more_calls: 0
            }),
            v
        );
    }
}
