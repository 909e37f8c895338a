//! The files this test process has mapped, for the tests that check which
//! copy of a HIP runtime the backend loaded.

/// The files this process has mapped (from /proc/self/maps) whose path
/// contains one of `names`, sorted, each once.
pub fn mapped_files(names: &[&str]) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut v: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_string))
        .filter(|p| p.starts_with('/') && names.iter().any(|n| p.contains(n)))
        .collect();
    v.sort();
    v.dedup();
    v
}
