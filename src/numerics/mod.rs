//! Numerics, the bottom layer: the number formats, the shared math, the
//! record layouts and their decoders, and the CPU reference of the writer.
//! Nothing here knows about tensors, plans or devices.

pub mod formats;
pub mod layout;
pub mod math;
pub mod reference;
