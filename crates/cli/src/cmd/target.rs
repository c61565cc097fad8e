//! `iscsi target`: serve block storage over iSCSI.
//!
//! With no arguments: one 1 GiB RAM LUN as `iqn.2026-11.rs.iscsi:target0` on
//! 127.0.0.1:3260.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use iscsi_scsi::{Backstore, RamBackstore};
use iscsi_target::{Server, TargetConfig, TargetEntry};

/// Command-line options of `iscsi target`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A portal to listen on (repeatable).
    #[arg(long = "listen", default_values_t = ["127.0.0.1:3260".parse::<SocketAddr>().expect("valid default")])]
    listen: Vec<SocketAddr>,
    /// The target's iSCSI name.
    #[arg(long, default_value = "iqn.2026-11.rs.iscsi:target0")]
    name: String,
    /// A LUN, numbered from 0 in order (repeatable): `ram:SIZE` (SIZE like
    /// 256M or 1G).
    #[arg(long = "lun", default_values_t = ["ram:1G".to_owned()])]
    luns: Vec<String>,
    /// Require one-way CHAP with this `USER:SECRET`.
    #[arg(long)]
    chap: Option<String>,
    /// Logical block size of every LUN: 512 or 4096.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
}

/// Parses sizes like `4096`, `64K`, `256M`, `1G`, `2T`.
fn parse_size(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = digits.parse().with_context(|| format!("size {text:?}"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => bail!("unknown size unit {other:?} in {text:?}"),
    };
    value
        .checked_mul(1 << shift)
        .with_context(|| format!("size {text:?} too large"))
}

fn backstore(spec: &str, block_size: u32, id: u64) -> anyhow::Result<Arc<dyn Backstore>> {
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    match kind {
        "ram" => {
            let size = parse_size(rest)?;
            let ram = RamBackstore::new(size, block_size, id)
                .map_err(|e| anyhow::anyhow!("LUN {spec:?}: {e}"))?;
            Ok(Arc::new(ram))
        }
        other => bail!("backstore kind {other:?} is not available in this build; use ram:SIZE"),
    }
}

/// Runs `iscsi target`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.block_size != 512 && args.block_size != 4096 {
        bail!("--block-size must be 512 or 4096");
    }
    let mut luns = Vec::new();
    for (i, spec) in args.luns.iter().enumerate() {
        let id = (u64::from(rand::random::<u32>()) << 16) | i as u64;
        luns.push(backstore(spec, args.block_size, id)?);
    }
    let mut target = TargetEntry {
        name: args.name.clone(),
        alias: Some("iscsi-rs".to_owned()),
        luns,
        chap: None,
        allowed_initiators: Vec::new(),
    };
    if let Some(chap) = &args.chap {
        let (user, secret) = chap.split_once(':').context("--chap wants USER:SECRET")?;
        target.require_chap(user, secret);
    }
    let config = TargetConfig {
        listen: args.listen.clone(),
        targets: vec![target],
        portal_group_tag: 1,
        negotiation: TargetConfig::default_negotiation(),
        command_window: 128,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let server = Server::bind(config).await.context("binding the portals")?;
        for address in server.local_addrs() {
            println!("iscsi target: serving {} on {address}", args.name);
            println!("  discover: iscsi-ls iscsi://{address}");
            println!("  inquiry:  iscsi-inq iscsi://{address}/{}/0", args.name);
        }
        server
            .run_until(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert!(backstore("file:/tmp/x", 512, 1).is_err());
    }
}
