//! `gpu_tests!`: the same test body as one test per GPU backend, CUDA and
//! HIP, each opening its device through `gpu_required`'s `on_gpu!` (declare
//! `mod gpu_required;` before `mod gpu_pair;`).

/// Defines `#[test] fn $cuda` and `#[test] fn $hip`, each running `$body`
/// with `$b` the opened backend. `label = "…"` names both in skip and
/// failure reports; `prefix = "…"` names each by that prefix and its own
/// test name.
macro_rules! gpu_tests {
    ($cuda:ident, $hip:ident, label = $label:expr, |$b:ident| $body:expr) => {
        #[test]
        fn $cuda() {
            on_gpu!(cuda, $label, |$b| $body);
        }

        #[test]
        fn $hip() {
            on_gpu!(hip, $label, |$b| $body);
        }
    };
    ($cuda:ident, $hip:ident, prefix = $prefix:literal, |$b:ident| $body:expr) => {
        #[test]
        fn $cuda() {
            on_gpu!(cuda, concat!($prefix, stringify!($cuda)), |$b| $body);
        }

        #[test]
        fn $hip() {
            on_gpu!(hip, concat!($prefix, stringify!($hip)), |$b| $body);
        }
    };
}
