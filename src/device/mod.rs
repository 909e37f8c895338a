//! The device interface, above the operations: the kernel ABI (parameter
//! blocks and flags generated from `kernels-hip/kv_abi.h`), the embedded
//! kernels, the launch policy, device detection and which embedded image runs on
//! which device (with the NVIDIA driver it needs). The backends sit on top.

pub mod detect;
pub mod kernel_abi;
pub mod kernels;
pub mod launch;
pub mod targets;
