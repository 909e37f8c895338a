//! `verify`: replays test-vector files on a backend and compares every byte.

use crate::args::Opts;
use crate::select::{with_backend, Job};
use crate::timing::Timing;
use crate::{CliError, CliResult};
use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::{Backend, Error, Result};
use std::fmt::Write as _;

/// `dsv4-kvcache verify FILE... [--backend B]`.
pub(crate) fn verify_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(args, &["backend"], &[])?;
    if o.positional.is_empty() {
        return Err(CliError::Usage("verify needs at least one FILE".into()));
    }
    let choice = o.backend()?;
    let (mismatched, errors) = with_backend(
        choice,
        VerifyJob {
            files: o.positional,
        },
    )?;
    if errors > 0 {
        return Err(CliError::Lib(Error::Vectors(format!(
            "{errors} file(s) could not be replayed"
        ))));
    }
    if mismatched > 0 {
        return Err(CliError::Check(format!(
            "{mismatched} file(s) differ from their expected outputs"
        )));
    }
    Ok(())
}

/// Replays each file, printing a verdict per file.
struct VerifyJob {
    files: Vec<String>,
}

impl Job for VerifyJob {
    type Out = (usize, usize);
    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        _: &T,
        notes: &[String],
    ) -> Result<(usize, usize)> {
        notes.iter().for_each(|n| println!("{n}"));
        println!("backend: {}", b.name());
        let (mut mismatched, mut errors) = (0, 0);
        for path in &self.files {
            let f = match VectorFile::load(path) {
                Ok(f) => f,
                Err(e) => {
                    println!("{path}: ERROR {e}");
                    errors += 1;
                    continue;
                }
            };
            let what = describe_file(&f);
            match f.replay(b) {
                Ok(r) => {
                    let verdict = if r.passed() { "PASS" } else { "FAIL" };
                    print!("{path}: {verdict} ({what})\n  {r}");
                    if !r.passed() {
                        mismatched += 1;
                    }
                }
                Err(e) => {
                    println!("{path}: ERROR ({what}) {e}");
                    errors += 1;
                }
            }
        }
        let ok = self.files.len() - mismatched - errors;
        println!(
            "{} file(s): {ok} pass, {mismatched} differ, {errors} could not be replayed",
            self.files.len()
        );
        Ok((mismatched, errors))
    }
}

/// The op and metadata of a file, in one line.
pub(crate) fn describe_file(f: &VectorFile) -> String {
    let mut s = f.meta.get("op").cloned().unwrap_or_default();
    for k in ["layout", "compress_ratio", "sanitize"] {
        if let Some(v) = f.meta.get(k) {
            let _ = write!(s, ", {k} {v}");
        }
    }
    if let Some(v) = f.meta.get("source") {
        let _ = write!(s, ", source: {v}");
    }
    s
}
