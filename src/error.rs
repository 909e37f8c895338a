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
    /// A driver or runtime call failed.
    #[error("{backend}: {call} failed: {message}")]
    Driver {
        /// `cuda` or `hip`.
        backend: &'static str,
        /// The API call.
        call: &'static str,
        /// The driver's message.
        message: String,
    },
    /// A test-vector file could not be read or is malformed.
    #[error("test vectors: {0}")]
    Vectors(String),
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;
