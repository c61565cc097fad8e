//! A reader for callgrind's output format (valgrind's "Callgrind Format
//! Specification"): each function's self cost and the inclusive cost of
//! every call between two functions, which is all `category` needs to
//! split a run's instructions into categories.
//!
//! Only the first event column is kept (`Ir`, instructions, the default and
//! only event of the runs `scripts/pdu-cost` makes). A function is keyed by
//! its object, its file and its name, as callgrind keys it, so two
//! monomorphised closures of the same name in different crates stay apart.

use std::collections::HashMap;

use anyhow::{Context, bail};

/// One function of a profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The ELF object (binary or shared library).
    pub object: String,
    /// The source file of its first instruction.
    pub file: String,
    /// The demangled name.
    pub name: String,
    /// Instructions executed in the function itself.
    pub self_cost: u64,
}

/// A call arc: `caller` called `callee`, which with everything below it
/// executed `inclusive` instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Index of the calling function.
    pub caller: usize,
    /// Index of the called function.
    pub callee: usize,
    /// Instructions of the call, callee and all it called included.
    pub inclusive: u64,
}

/// A whole profile: functions, calls and callgrind's own total.
#[derive(Debug, Default)]
pub struct Profile {
    /// Every function that executed or was called.
    pub functions: Vec<Function>,
    /// Every call arc, summed over call sites.
    pub calls: Vec<Call>,
    /// The `summary:`/`totals:` line: the instructions of the whole run.
    pub total: u64,
}

/// A name table for one of callgrind's compressed name spaces: `(id) name`
/// defines, `(id)` refers back.
#[derive(Default)]
struct Names(HashMap<u64, String>);

impl Names {
    fn resolve(&mut self, text: &str) -> anyhow::Result<String> {
        let text = text.trim();
        let Some(rest) = text.strip_prefix('(') else {
            return Ok(text.to_owned());
        };
        let (id, name) = rest
            .split_once(')')
            .with_context(|| format!("malformed compressed name {text:?}"))?;
        let id: u64 = id
            .parse()
            .with_context(|| format!("bad name id in {text:?}"))?;
        let name = name.trim();
        if name.is_empty() {
            self.0
                .get(&id)
                .cloned()
                .with_context(|| format!("name id {id} used before it was defined"))
        } else {
            self.0.insert(id, name.to_owned());
            Ok(name.to_owned())
        }
    }
}

/// The profile builder: interns functions and sums calls.
#[derive(Default)]
struct Builder {
    index: HashMap<(String, String, String), usize>,
    functions: Vec<Function>,
    calls: HashMap<(usize, usize), u64>,
}

impl Builder {
    fn function(&mut self, object: &str, file: &str, name: &str) -> usize {
        let key = (object.to_owned(), file.to_owned(), name.to_owned());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        self.functions.push(Function {
            object: key.0.clone(),
            file: key.1.clone(),
            name: key.2.clone(),
            self_cost: 0,
        });
        self.index.insert(key, self.functions.len() - 1);
        self.functions.len() - 1
    }
}

/// Parses callgrind output text.
pub fn parse(text: &str) -> anyhow::Result<Profile> {
    let mut objects = Names::default();
    let mut files = Names::default();
    let mut fns = Names::default();
    let mut builder = Builder::default();
    let mut positions = 1usize;
    let mut total = None;
    // Where cost lines are: the function and the current (maybe inlined) file.
    let mut object = String::new();
    let mut fn_file = String::new();
    let mut position_file = String::new();
    let mut current: Option<usize> = None;
    // The callee named by cob=/cfi=/cfn= for the next calls= line.
    let mut callee_object: Option<String> = None;
    let mut callee_file: Option<String> = None;
    let mut callee_name: Option<String> = None;
    let mut pending_call: Option<usize> = None;
    for (number, line) in text.lines().enumerate() {
        let context = || format!("callgrind line {}", number + 1);
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*') {
            let mut fields = line.split_ascii_whitespace().skip(positions);
            let cost: u64 = match fields.next() {
                Some(field) => field.parse().with_context(context)?,
                None => 0,
            };
            if let Some(callee) = pending_call.take() {
                let caller = current.with_context(context)?;
                *builder.calls.entry((caller, callee)).or_default() += cost;
            } else {
                let function = current.with_context(context)?;
                builder.functions[function].self_cost += cost;
            }
            continue;
        }
        // `key=value` (names, calls) or `key: value` (headers), split at
        // whichever comes first: a `cmd:` header may hold an `=`.
        let Some(split) = line.find(['=', ':']) else {
            bail!("{}: unrecognised line {line:?}", context());
        };
        let (key, value) = (&line[..split], &line[split + 1..]);
        match key {
            "ob" => object = objects.resolve(value)?,
            "fl" => {
                fn_file = files.resolve(value)?;
                position_file = fn_file.clone();
            }
            "fi" | "fe" => position_file = files.resolve(value)?,
            "fn" => {
                let name = fns.resolve(value)?;
                position_file = fn_file.clone();
                current = Some(builder.function(&object, &fn_file, &name));
            }
            "cob" => callee_object = Some(objects.resolve(value)?),
            "cfi" | "cfl" => callee_file = Some(files.resolve(value)?),
            "cfn" => callee_name = Some(fns.resolve(value)?),
            "calls" => {
                let name = callee_name.take().with_context(context)?;
                let object = callee_object.take().unwrap_or_else(|| object.clone());
                let file = callee_file.take().unwrap_or_else(|| position_file.clone());
                pending_call = Some(builder.function(&object, &file, &name));
            }
            "positions" => positions = value.split_ascii_whitespace().count().max(1),
            "summary" | "totals" => {
                let value: u64 = value
                    .split_ascii_whitespace()
                    .next()
                    .unwrap_or("0")
                    .parse()
                    .with_context(context)?;
                total = Some(total.unwrap_or(0).max(value));
            }
            "events" if value.split_ascii_whitespace().next() != Some("Ir") => {
                bail!("the first event must be Ir, not {value:?}");
            }
            // Headers and jump arcs (--collect-jumps) carry no costs we use.
            _ => {}
        }
    }
    let total = total.context("no summary: or totals: line (a truncated file?)")?;
    let calls = builder
        .calls
        .into_iter()
        .map(|((caller, callee), inclusive)| Call {
            caller,
            callee,
            inclusive,
        })
        .collect();
    Ok(Profile {
        functions: builder.functions,
        calls,
        total,
    })
}

impl Profile {
    /// The sum of every function's self cost: equal to [`Profile::total`]
    /// for a whole file, the check that nothing was lost in parsing.
    pub fn self_total(&self) -> u64 {
        self.functions.iter().map(|f| f.self_cost).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written profile in callgrind's compressed format: `main`
    /// calls `work` (inlined file switch included) which calls `memcpy` in
    /// libc; `work` is referenced by id before its own `fn=` block.
    const SAMPLE: &str = "\
# callgrind format
version: 1
cmd: app --set HeaderDigest=CRC32C
positions: line
events: Ir
summary: 155

ob=(1) /bin/app
fl=(1) src/main.rs
fn=(1) main
10 10
fi=(2) src/inlined.rs
11 5
fe=(1)
cfl=(3) src/work.rs
cfn=(2) app::work
calls=2 5
12 145

fn=(3) cold
0 0

fl=(3)
fn=(2)
5 40
cob=(2) /lib/libc.so.6
cfi=(4) memmove.S
cfn=(4) memcpy
calls=4 0
6 100

ob=(2)
fl=(4)
fn=(4)
0 100
";

    #[test]
    fn parses_functions_calls_and_total() {
        let profile = parse(SAMPLE).unwrap();
        assert_eq!(profile.total, 155);
        assert_eq!(profile.self_total(), 155);
        let find = |name: &str| {
            profile
                .functions
                .iter()
                .position(|f| f.name == name)
                .unwrap()
        };
        let (main, work, memcpy) = (find("main"), find("app::work"), find("memcpy"));
        assert_eq!(profile.functions[main].self_cost, 15);
        assert_eq!(profile.functions[work].self_cost, 40);
        assert_eq!(profile.functions[work].file, "src/work.rs");
        assert_eq!(profile.functions[memcpy].object, "/lib/libc.so.6");
        let mut calls: Vec<_> = profile
            .calls
            .iter()
            .map(|c| (c.caller, c.callee, c.inclusive))
            .collect();
        calls.sort_unstable();
        let mut want = vec![(main, work, 145), (work, memcpy, 100)];
        want.sort_unstable();
        assert_eq!(calls, want);
        // Four functions: `cold` was defined but ran nothing.
        assert_eq!(profile.functions.len(), 4);
    }

    #[test]
    fn refuses_a_file_without_a_total_and_unknown_ids() {
        assert!(parse("events: Ir\nfn=(1) a\n1 5\n").is_err());
        assert!(parse("events: Ir\nsummary: 5\nfn=(7)\n1 5\n").is_err());
        assert!(parse("events: Dr\nsummary: 5\n").is_err());
    }
}
