//! `iscsi discover HOST[:PORT]` (SendTargets) and `iscsi ls URL` (the LUNs
//! of a target with their size, type, vendor and product; only the URL's
//! LUN when it names one).

use anyhow::{Context, bail};
use iscsi_initiator::url::{format_portal, parse_portal};
use iscsi_initiator::{IscsiUrl, discover_url};

use super::initiator_args::{SessionArgs, block_on, connect};
use super::missing_lun;

/// Options of `iscsi discover`.
#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    /// The portal: HOST[:PORT], [IPv6][:PORT], or an iscsi:// or iser://
    /// URL (iser:// discovers over iSER).
    portal: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// Prints each target and its portals.
pub fn run_discover(args: &DiscoverArgs) -> anyhow::Result<()> {
    let url = if args.portal.contains("://") {
        args.portal.parse::<IscsiUrl>()?
    } else {
        let (host, port) = parse_portal(&args.portal).context("bad portal: want HOST[:PORT]")?;
        format!("iscsi://{}", format_portal(&host, port)).parse::<IscsiUrl>()?
    };
    let portal = url.portal();
    let config = args.session.config()?;
    let targets = block_on(async {
        discover_url(&url, &config)
            .await
            .with_context(|| format!("discovery at {portal}"))
    })?;
    for target in targets {
        println!("{}", target.name);
        for address in target.addresses {
            match address.portal_group_tag {
                Some(tag) => println!("  {} (portal group {tag})", address.portal),
                None => println!("  {}", address.portal),
            }
        }
    }
    Ok(())
}

/// Options of `iscsi ls`.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn[/lun]: every LUN,
    /// or only the one named.
    url: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// Prints one line per LUN.
pub fn run_ls(args: &LsArgs) -> anyhow::Result<()> {
    let url = super::initiator_args::target_url(&args.url)?;
    block_on(async {
        let session = connect(&url, &args.session).await?;
        let mut luns = session.report_luns().await.context("REPORT LUNS")?;
        if url.lun_named {
            if !luns.contains(&url.lun) {
                bail!(missing_lun::headline(url.lun, Some(luns)));
            }
            luns = vec![url.lun];
        }
        println!(
            "{:>5}  {:<8}  {:>14}  {:>6}  vendor / product",
            "LUN", "type", "bytes", "block"
        );
        for lun in luns {
            let inquiry = session
                .inquiry(lun)
                .await
                .with_context(|| format!("INQUIRY of LUN {lun}"))?;
            // Listed by REPORT LUNS, yet maybe gone by now.
            missing_lun::check_inquiry(&session, lun, &inquiry).await?;
            let (bytes, block) = if inquiry.device_type == 0 {
                match session.read_capacity(lun).await {
                    Ok(c) => (c.bytes().to_string(), c.block_size.to_string()),
                    Err(_) => ("-".to_owned(), "-".to_owned()),
                }
            } else {
                ("-".to_owned(), "-".to_owned())
            };
            println!(
                "{lun:>5}  {:<8}  {bytes:>14}  {block:>6}  {} / {} {}",
                inquiry.device_type_name(),
                inquiry.vendor,
                inquiry.product,
                inquiry.revision
            );
        }
        session.logout().await.context("logout")?;
        Ok(())
    })
}
