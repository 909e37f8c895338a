//! Operations, above the numerics: tensor descriptions, each operation's
//! arguments and tensor table, their validation into plans (`ops`), and the
//! reader's plan, reference, launch policy and parameter block (`gather`),
//! and the indexer key store's (`indexer_k`).

pub mod gather;
pub mod indexer_k;
pub mod ops;
pub mod tensor;
