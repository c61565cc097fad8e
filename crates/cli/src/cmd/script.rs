//! `iscsi script FILE`: a small command interpreter in the spirit of the
//! UNH user-space initiator's. One command per line, `#` starts a comment:
//!
//! ```text
//! set MaxBurstLength=65536        # a key for the next login
//! login iscsi://127.0.0.1/iqn.2026-11.rs.iscsi:target0/0
//! write 0 8 0xa5                  # LBA, blocks, fill byte (default: random)
//! read 0 8 0xa5                   # LBA, blocks, byte every byte must equal
//! repeat 100                      # the block up to `end`, timed per run
//!   read 0 2048
//! end
//! inquiry | capacity | tur | sync | reserve | release | ping | sleep MS | echo TEXT
//! logout
//! ```
//!
//! `repeat` writes one line per run (run number and microseconds) to the
//! log (`--log FILE`, default stderr) and a summary at the end.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use iscsi_initiator::{IscsiUrl, Session};

use super::initiator_args::{SessionArgs, block_on};

/// Options of `iscsi script`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The script ("-" for stdin).
    file: String,
    /// Where `repeat` writes its per-run timings (default: stderr).
    #[arg(long)]
    log: Option<String>,
    #[command(flatten)]
    session: SessionArgs,
}

/// One parsed script line.
#[derive(Debug, Clone)]
enum Step {
    Set(String, String),
    Login(String),
    Logout,
    Read {
        lba: u64,
        blocks: u32,
        expect: Option<u8>,
    },
    Write {
        lba: u64,
        blocks: u32,
        fill: Option<u8>,
    },
    Repeat {
        count: u64,
        body: Vec<(usize, Step)>,
    },
    Inquiry,
    Capacity,
    TestUnitReady,
    Sync,
    Reserve,
    Release,
    Ping,
    Sleep(u64),
    Echo(String),
}

fn parse_number(text: &str) -> anyhow::Result<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .with_context(|| format!("bad number {text:?}"))
}

fn parse_byte(text: Option<&&str>) -> anyhow::Result<Option<u8>> {
    text.map(|t| u8::try_from(parse_number(t)?).with_context(|| format!("{t:?} is not a byte")))
        .transpose()
}

/// A `repeat` whose `end` is still to come: its line, count and the steps
/// of the enclosing block so far.
type OpenRepeat = (usize, u64, Vec<(usize, Step)>);

/// Parses the lines of a script into steps (with their line numbers).
fn parse(text: &str) -> anyhow::Result<Vec<(usize, Step)>> {
    let mut stack: Vec<OpenRepeat> = Vec::new();
    let mut top = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = || format!("line {number}: {line}");
        let step = match words.as_slice() {
            ["set", pair] => {
                let (k, v) = pair
                    .split_once('=')
                    .with_context(|| format!("{}: set KEY=VALUE", at()))?;
                Step::Set(k.to_owned(), v.to_owned())
            }
            ["login", url] => Step::Login((*url).to_owned()),
            ["logout"] => Step::Logout,
            ["read", lba, blocks, rest @ ..] if rest.len() <= 1 => Step::Read {
                lba: parse_number(lba).with_context(at)?,
                blocks: u32::try_from(parse_number(blocks).with_context(at)?).with_context(at)?,
                expect: parse_byte(rest.first()).with_context(at)?,
            },
            ["write", lba, blocks, rest @ ..] if rest.len() <= 1 => Step::Write {
                lba: parse_number(lba).with_context(at)?,
                blocks: u32::try_from(parse_number(blocks).with_context(at)?).with_context(at)?,
                fill: parse_byte(rest.first()).with_context(at)?,
            },
            ["repeat", count] => {
                stack.push((
                    number,
                    parse_number(count).with_context(at)?,
                    std::mem::take(&mut top),
                ));
                continue;
            }
            ["end"] => {
                let (start, count, outer) = stack
                    .pop()
                    .with_context(|| format!("{}: end without repeat", at()))?;
                let body = std::mem::replace(&mut top, outer);
                top.push((start, Step::Repeat { count, body }));
                continue;
            }
            ["inquiry"] => Step::Inquiry,
            ["capacity"] => Step::Capacity,
            ["tur"] => Step::TestUnitReady,
            ["sync"] => Step::Sync,
            ["reserve"] => Step::Reserve,
            ["release"] => Step::Release,
            ["ping"] => Step::Ping,
            ["sleep", ms] => Step::Sleep(parse_number(ms).with_context(at)?),
            ["echo", ..] => Step::Echo(line["echo".len()..].trim().to_owned()),
            _ => bail!("{}: unknown command", at()),
        };
        top.push((number, step));
    }
    if let Some((start, _, _)) = stack.last() {
        bail!("line {start}: repeat without end");
    }
    Ok(top)
}

/// The interpreter's state.
struct Interpreter {
    args: SessionArgs,
    pending: Vec<(String, String)>,
    session: Option<(Session, IscsiUrl, u32)>,
    log: Box<dyn Write + Send>,
}

impl Interpreter {
    fn session(&self) -> anyhow::Result<&(Session, IscsiUrl, u32)> {
        self.session
            .as_ref()
            .context("not logged in (use `login URL`)")
    }

    async fn run(&mut self, steps: &[(usize, Step)]) -> anyhow::Result<()> {
        for (line, step) in steps {
            Box::pin(self.step(step))
                .await
                .with_context(|| format!("line {line}"))?;
        }
        Ok(())
    }

    async fn step(&mut self, step: &Step) -> anyhow::Result<()> {
        match step {
            Step::Set(key, value) => {
                // Checked now, applied at the next login.
                let mut probe = self.args.config()?;
                probe.set(key, value)?;
                self.pending.push((key.clone(), value.clone()));
            }
            Step::Login(url) => {
                if let Some((session, _, _)) = self.session.take() {
                    let _ = session.logout().await;
                }
                let url: IscsiUrl = url.parse()?;
                let mut config = self.args.config()?;
                for (k, v) in &self.pending {
                    config.set(k, v)?;
                }
                let session = Session::connect(&url, config).await.context("login")?;
                let capacity = session
                    .read_capacity(url.lun)
                    .await
                    .context("READ CAPACITY")?;
                println!(
                    "logged in to {url}: {} blocks of {} bytes",
                    capacity.blocks, capacity.block_size
                );
                self.session = Some((session, url, capacity.block_size));
            }
            Step::Logout => {
                let (session, _, _) = self.session.take().context("not logged in")?;
                session.logout().await.context("logout")?;
                println!("logged out");
            }
            Step::Read {
                lba,
                blocks,
                expect,
            } => {
                let (session, url, bs) = self.session()?;
                let buffer = vec![0u8; *blocks as usize * *bs as usize];
                let data = session.read(url.lun, *lba, *bs, buffer).await?;
                if let Some(byte) = expect
                    && let Some(at) = data.iter().position(|b| b != byte)
                {
                    bail!("byte {at} is {:#04x}, expected {byte:#04x}", data[at]);
                }
            }
            Step::Write { lba, blocks, fill } => {
                let (session, url, bs) = self.session()?;
                let len = *blocks as usize * *bs as usize;
                let data: Vec<u8> = match fill {
                    Some(byte) => vec![*byte; len],
                    None => (0..len).map(|_| rand::random()).collect(),
                };
                session.write(url.lun, *lba, *bs, &data).await?;
            }
            Step::Repeat { count, body } => {
                let mut total = Duration::ZERO;
                for run in 1..=*count {
                    let start = Instant::now();
                    Box::pin(self.run(body)).await?;
                    let elapsed = start.elapsed();
                    total += elapsed;
                    writeln!(self.log, "run {run} {} us", elapsed.as_micros())?;
                }
                writeln!(
                    self.log,
                    "repeat {count}: total {:.3} ms, mean {:.1} us per run",
                    total.as_secs_f64() * 1e3,
                    total.as_secs_f64() * 1e6 / (*count).max(1) as f64
                )?;
            }
            Step::Inquiry => {
                let (session, url, _) = self.session()?;
                let i = session.inquiry(url.lun).await?;
                println!(
                    "{} {} {} ({})",
                    i.vendor,
                    i.product,
                    i.revision,
                    i.device_type_name()
                );
            }
            Step::Capacity => {
                let (session, url, _) = self.session()?;
                let c = session.read_capacity(url.lun).await?;
                println!(
                    "{} blocks of {} bytes ({} bytes)",
                    c.blocks,
                    c.block_size,
                    c.bytes()
                );
            }
            Step::TestUnitReady => {
                let (session, url, _) = self.session()?;
                session.test_unit_ready(url.lun).await?;
            }
            Step::Sync => {
                let (session, url, _) = self.session()?;
                session.synchronize_cache(url.lun).await?;
            }
            Step::Reserve => {
                let (session, url, _) = self.session()?;
                session.reserve(url.lun).await?;
            }
            Step::Release => {
                let (session, url, _) = self.session()?;
                session.release(url.lun).await?;
            }
            Step::Ping => {
                let (session, _, _) = self.session()?;
                let rtt = session.ping().await?;
                println!("ping: {} us", rtt.as_micros());
            }
            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Step::Echo(text) => println!("{text}"),
        }
        Ok(())
    }
}

/// Runs a script.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let text = if args.file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the script")?
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let steps = parse(&text)?;
    let log: Box<dyn Write + Send> = match &args.log {
        Some(path) => {
            Box::new(std::fs::File::create(path).with_context(|| format!("creating {path}"))?)
        }
        None => Box::new(std::io::stderr()),
    };
    block_on(async {
        let mut interpreter = Interpreter {
            args: args.session.clone(),
            pending: Vec::new(),
            session: None,
            log,
        };
        let result = interpreter.run(&steps).await;
        if let Some((session, _, _)) = interpreter.session.take() {
            let _ = session.logout().await;
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_repeat() {
        let steps = parse("set MaxBurstLength=1\nlogin iscsi://h/t/0\nrepeat 2 # x\n read 0 1\n repeat 3\n  write 0 1 0xff\n end\nend\nlogout\n").unwrap();
        assert_eq!(steps.len(), 4);
        let Step::Repeat { count: 2, body } = &steps[2].1 else {
            panic!("{steps:?}")
        };
        assert!(matches!(body[1].1, Step::Repeat { count: 3, .. }));
        assert!(parse("repeat 2\nread 0 1\n").is_err());
        assert!(parse("end\n").is_err());
        assert!(parse("frobnicate\n").is_err());
        assert!(parse("write 0 1 300\n").is_err());
    }
}
