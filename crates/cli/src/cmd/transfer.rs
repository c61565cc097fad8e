//! `iscsi read`, `iscsi write` and `iscsi copy`: moving bytes between
//! iSCSI LUNs, files and stdin/stdout. Byte offsets and lengths need not
//! be block-aligned: partial blocks at either end are read, patched and
//! written back.

use std::io::{Read, Write};

use anyhow::{Context, bail};

use iscsi_initiator::Disk;
use tokio::task::JoinSet;

use super::initiator_args::{SessionArgs, block_on, open_disk, parse_size};

/// Commands in flight during a copy.
const COPY_DEPTH: usize = 8;

/// Options of `iscsi read`.
#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun
    url: String,
    /// Byte offset on the LUN (K/M/G suffixes allowed).
    #[arg(long, default_value = "0")]
    offset: String,
    /// Bytes to read (default: to the end of the LUN).
    #[arg(long)]
    length: Option<String>,
    /// Output file (default: stdout).
    #[arg(long, short)]
    output: Option<String>,
    /// Bytes per command (K/M suffixes): at most this, and never more
    /// than the LUN's maximum transfer (Block Limits MAXIMUM TRANSFER
    /// LENGTH; 1 MiB where the LUN states none).
    #[arg(long, default_value = "1M")]
    chunk: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// Options of `iscsi write`.
#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun
    url: String,
    /// Input file ("-" for stdin).
    #[arg(long, short)]
    input: String,
    /// Byte offset on the LUN (K/M/G suffixes allowed).
    #[arg(long, default_value = "0")]
    offset: String,
    /// Bytes per command (K/M suffixes): at most this, and never more
    /// than the LUN's maximum transfer (Block Limits MAXIMUM TRANSFER
    /// LENGTH; 1 MiB where the LUN states none).
    #[arg(long, default_value = "1M")]
    chunk: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// Options of `iscsi copy`.
#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Source: a file or an iscsi:// URL.
    source: String,
    /// Destination: a file or an iscsi:// URL.
    destination: String,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Bytes per command (K/M suffixes): at most this, and never more
    /// than the LUN's maximum transfer (Block Limits MAXIMUM TRANSFER
    /// LENGTH; 1 MiB where the LUN states none).
    #[arg(long, default_value = "1M")]
    chunk: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// A LUN end of a transfer: the initiator's [`Disk`], which does the
/// partial blocks and the splitting into commands, with byte ranges checked
/// here so that a mistake is said in the user's terms.
struct Lun {
    disk: Disk,
}

impl Lun {
    async fn open(url: &str, args: &SessionArgs) -> anyhow::Result<Lun> {
        let disk = open_disk(&[url.to_owned()], args).await?;
        Ok(Lun { disk })
    }

    fn bytes(&self) -> u64 {
        self.disk.limits().bytes()
    }

    /// Bytes per step: `wanted`, within the LUN's maximum transfer, in
    /// whole blocks, at least one block.
    fn chunk(&self, wanted: u64) -> u64 {
        let limits = self.disk.limits();
        let bs = u64::from(limits.block_size);
        (wanted.min(u64::from(limits.max_transfer)) / bs).max(1) * bs
    }

    fn check_range(&self, offset: u64, length: u64) -> anyhow::Result<()> {
        match offset.checked_add(length) {
            Some(end) if end <= self.bytes() => Ok(()),
            _ => bail!(
                "{offset}+{length} is beyond the LUN's {} bytes",
                self.bytes()
            ),
        }
    }

    /// Reads `length` bytes at byte `offset` (any alignment).
    async fn read_bytes(&self, offset: u64, length: u64) -> anyhow::Result<Vec<u8>> {
        self.disk
            .read(offset, length as usize)
            .await
            .with_context(|| format!("READ at byte {offset}"))
    }

    /// Writes `data` at byte `offset` (any alignment).
    async fn write_bytes(&self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.disk
            .write(offset, data, false)
            .await
            .with_context(|| format!("WRITE at byte {offset}"))
    }

    async fn flush(&self) -> anyhow::Result<()> {
        self.disk.flush().await.context("SYNCHRONIZE CACHE")
    }

    async fn logout(&self) -> anyhow::Result<()> {
        self.disk.paths().logout().await.context("logout")
    }
}

/// Copies LUN bytes to a file or stdout.
pub fn run_read(args: &ReadArgs) -> anyhow::Result<()> {
    let offset = parse_size(&args.offset)?;
    block_on(async {
        let lun = Lun::open(&args.url, &args.session).await?;
        let length = match &args.length {
            Some(l) => parse_size(l)?,
            None => lun.bytes().saturating_sub(offset),
        };
        lun.check_range(offset, length)?;
        let mut out: Box<dyn Write> = match args.output.as_deref() {
            None | Some("-") => Box::new(std::io::stdout().lock()),
            Some(path) => {
                Box::new(std::fs::File::create(path).with_context(|| format!("creating {path}"))?)
            }
        };
        let chunk = lun.chunk(parse_size(&args.chunk)?);
        let mut done = 0;
        while done < length {
            let n = chunk.min(length - done);
            let data = lun.read_bytes(offset + done, n).await?;
            out.write_all(&data).context("writing the output")?;
            done += n;
        }
        out.flush().context("writing the output")?;
        lun.logout().await?;
        Ok(())
    })
}

/// Copies a file or stdin onto the LUN.
pub fn run_write(args: &WriteArgs) -> anyhow::Result<()> {
    let offset = parse_size(&args.offset)?;
    let mut input: Box<dyn Read> = if args.input == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(&args.input).with_context(|| format!("opening {}", args.input))?,
        )
    };
    block_on(async {
        let lun = Lun::open(&args.url, &args.session).await?;
        let mut at = offset;
        let mut buffer = vec![0u8; lun.chunk(parse_size(&args.chunk)?) as usize];
        loop {
            let n = read_full(&mut input, &mut buffer)?;
            if n == 0 {
                break;
            }
            lun.check_range(at, n as u64)?;
            lun.write_bytes(at, &buffer[..n]).await?;
            at += n as u64;
        }
        lun.flush().await?;
        lun.logout().await?;
        eprintln!("wrote {} bytes at offset {offset}", at - offset);
        Ok(())
    })
}

/// Reads until `buffer` is full or the input ends.
fn read_full(input: &mut dyn Read, buffer: &mut [u8]) -> anyhow::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the input"),
        }
    }
    Ok(filled)
}

/// One end of a copy.
enum Endpoint {
    File(std::fs::File, u64),
    Iscsi(std::sync::Arc<Lun>),
}

impl Endpoint {
    async fn open(spec: &str, args: &SessionArgs, create: bool) -> anyhow::Result<Endpoint> {
        if spec.starts_with("iscsi://") || spec.starts_with("iser://") {
            return Ok(Endpoint::Iscsi(std::sync::Arc::new(
                Lun::open(spec, args).await?,
            )));
        }
        let file = if create {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(spec)
        } else {
            std::fs::File::open(spec)
        }
        .with_context(|| format!("opening {spec}"))?;
        let size = file.metadata()?.len();
        Ok(Endpoint::File(file, size))
    }

    fn size(&self) -> u64 {
        match self {
            Endpoint::File(_, size) => *size,
            Endpoint::Iscsi(lun) => lun.bytes(),
        }
    }

    async fn close(self) -> anyhow::Result<()> {
        match self {
            Endpoint::File(file, _) => file.sync_all().context("syncing the file"),
            Endpoint::Iscsi(lun) => {
                lun.flush().await?;
                lun.logout().await
            }
        }
    }
}

/// Copies between files and LUNs, several chunks in flight, with a
/// progress bar.
pub fn run_copy(args: &CopyArgs) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    block_on(async {
        let source = Endpoint::open(&args.source, &args.session, false).await?;
        let destination = Endpoint::open(&args.destination, &args.session, true).await?;
        let size = source.size();
        if let Endpoint::Iscsi(lun) = &destination
            && size > lun.bytes()
        {
            bail!(
                "the source ({size} bytes) does not fit the LUN ({} bytes)",
                lun.bytes()
            );
        }
        let bar = if args.quiet {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(size)
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .context("progress bar template")?,
        );
        let mut chunk = parse_size(&args.chunk)?;
        for end in [&source, &destination] {
            if let Endpoint::Iscsi(lun) = end {
                chunk = lun.chunk(chunk);
            }
        }
        let mut jobs: JoinSet<anyhow::Result<u64>> = JoinSet::new();
        let mut offset = 0u64;
        let start = std::time::Instant::now();
        while offset < size || !jobs.is_empty() {
            while offset < size && jobs.len() < COPY_DEPTH {
                let n = chunk.min(size - offset);
                let at = offset;
                let src = match &source {
                    Endpoint::File(f, _) => Endpoint::File(f.try_clone()?, 0),
                    Endpoint::Iscsi(l) => Endpoint::Iscsi(l.clone()),
                };
                let dst = match &destination {
                    Endpoint::File(f, _) => Endpoint::File(f.try_clone()?, 0),
                    Endpoint::Iscsi(l) => Endpoint::Iscsi(l.clone()),
                };
                jobs.spawn(async move {
                    let data = match src {
                        Endpoint::File(f, _) => {
                            let mut data = vec![0u8; n as usize];
                            f.read_exact_at(&mut data, at)
                                .context("reading the source")?;
                            data
                        }
                        Endpoint::Iscsi(lun) => lun.read_bytes(at, n).await?,
                    };
                    match dst {
                        Endpoint::File(f, _) => f
                            .write_all_at(&data, at)
                            .context("writing the destination")?,
                        Endpoint::Iscsi(lun) => lun.write_bytes(at, &data).await?,
                    }
                    Ok(n)
                });
                offset += n;
            }
            if let Some(done) = jobs.join_next().await {
                bar.inc(done.context("copy task")??);
            }
        }
        bar.finish_and_clear();
        if let Endpoint::File(f, _) = &destination {
            f.set_len(size.max(f.metadata()?.len()))?;
        }
        source.close().await?;
        destination.close().await?;
        let seconds = start.elapsed().as_secs_f64();
        eprintln!(
            "copied {size} bytes in {seconds:.2} s ({:.1} MiB/s)",
            size as f64 / (1 << 20) as f64 / seconds.max(1e-9)
        );
        Ok(())
    })
}
