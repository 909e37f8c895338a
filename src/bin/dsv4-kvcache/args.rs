//! Command-line options: `--name value`, `--name=value` and `--flag`.

use crate::select::Choice;
use crate::{CliError, CliResult, USAGE};
use dsv4_kvcache::layout::RecordOrder;
use std::collections::BTreeMap;

/// Parsed options: `--name value`, `--name=value` and `--flag`.
pub(crate) struct Opts {
    values: BTreeMap<String, String>,
    flags: Vec<String>,
    pub(crate) positional: Vec<String>,
}

impl Opts {
    pub(crate) fn parse(
        args: &[String],
        value_opts: &[&str],
        flag_opts: &[&str],
    ) -> CliResult<Opts> {
        let mut o = Opts {
            values: BTreeMap::new(),
            flags: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-h" || a == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let Some(body) = a.strip_prefix("--") else {
                o.positional.push(a.clone());
                continue;
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if value_opts.contains(&name) {
                let v = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| CliError::Usage(format!("--{name} needs a value")))?,
                };
                o.values.insert(name.to_string(), v);
            } else if flag_opts.contains(&name) && inline.is_none() {
                o.flags.push(name.to_string());
            } else {
                return Err(CliError::Usage(format!("unknown option --{name}")));
            }
        }
        Ok(o)
    }

    pub(crate) fn no_positional(&self) -> CliResult<()> {
        match self.positional.first() {
            Some(p) => Err(CliError::Usage(format!("unexpected argument {p:?}"))),
            None => Ok(()),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    pub(crate) fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> CliResult<T> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| CliError::Usage(format!("--{name} {v:?} is not a valid number"))),
        }
    }

    pub(crate) fn backend(&self) -> CliResult<Choice> {
        match self.get("backend").unwrap_or("auto") {
            "auto" => Ok(Choice::Auto),
            "cpu" => Ok(Choice::Cpu),
            // Undocumented self-check: the CPU reference on one thread,
            // treated as a device and compared with the multi-threaded one.
            "cpu1" => Ok(Choice::Cpu1),
            "cuda" => Ok(Choice::Cuda),
            "hip" => Ok(Choice::Hip),
            other => Err(CliError::Usage(format!(
                "--backend {other:?}, expected auto, cpu, cuda or hip"
            ))),
        }
    }
}

/// `--record-order planar|per_token` (default planar): where the paged
/// records' scales go.
pub(crate) fn record_order_opt(o: &Opts) -> CliResult<RecordOrder> {
    let v = o.get("record-order").unwrap_or("planar");
    RecordOrder::from_name(v).ok_or_else(|| {
        CliError::Usage(format!(
            "--record-order {v:?}, expected planar or per_token"
        ))
    })
}
