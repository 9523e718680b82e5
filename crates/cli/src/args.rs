//! A small argument parser: positional arguments, `--flag`, `--key value` and `--key=value`.

use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// Parsed arguments of one command.
pub struct Args {
    pub positional: Vec<String>,
    options: BTreeMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    /// Parses `argv`; `valued` lists the options that take a value, `flags` those that do not.
    pub fn parse(argv: &[String], valued: &[&str], flags: &[&str]) -> Result<Args> {
        let mut a = Args { positional: Vec::new(), options: BTreeMap::new(), flags: Vec::new() };
        let mut i = 0;
        while i < argv.len() {
            let s = &argv[i];
            if let Some(name) = s.strip_prefix("--") {
                let (name, inline) = match name.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (name, None),
                };
                if valued.contains(&name) {
                    let v = match inline {
                        Some(v) => v,
                        None => {
                            i += 1;
                            match argv.get(i) {
                                Some(v) => v.clone(),
                                None => bail!("option --{name} needs a value"),
                            }
                        }
                    };
                    a.options.insert(name.to_string(), v);
                } else if flags.contains(&name) && inline.is_none() {
                    a.flags.push(name.to_string());
                } else {
                    bail!("unknown option --{name}");
                }
            } else {
                a.positional.push(s.clone());
            }
            i += 1;
        }
        Ok(a)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.options.get(name).map(String::as_str)
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }
}
