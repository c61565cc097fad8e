//! `iscsi inquiry URL` (standard INQUIRY data and the unit serial number)
//! and `iscsi capacity URL` (READ CAPACITY).

use anyhow::Context;

use super::initiator_args::{SessionArgs, block_on, connect, target_url};
use super::missing_lun;

/// Options of `iscsi inquiry` and `iscsi capacity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// iscsi://[user[%secret]@]host[:port]/target-iqn/lun
    url: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    session: SessionArgs,
}

/// Prints the INQUIRY data.
pub fn run_inquiry(args: &Args) -> anyhow::Result<()> {
    let url = target_url(&args.url)?;
    block_on(async {
        let session = connect(&url, &args.session).await?;
        let inquiry = session.inquiry(url.lun).await;
        let inquiry = missing_lun::checked(&session, url.lun, "INQUIRY", inquiry).await?;
        missing_lun::check_inquiry(&session, url.lun, &inquiry).await?;
        let serial = session
            .inquiry_vpd(url.lun, 0x80)
            .await
            .ok()
            .filter(|page| page.len() > 4)
            .map(|page| String::from_utf8_lossy(&page[4..]).trim().to_owned());
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "device_type": inquiry.device_type,
                    "device_type_name": inquiry.device_type_name(),
                    "removable": inquiry.removable,
                    "version": inquiry.version,
                    "vendor": inquiry.vendor,
                    "product": inquiry.product,
                    "revision": inquiry.revision,
                    "serial": serial,
                })
            );
        } else {
            println!(
                "device type: {} ({:#04x})",
                inquiry.device_type_name(),
                inquiry.device_type
            );
            println!("removable:   {}", inquiry.removable);
            println!("version:     {:#04x}", inquiry.version);
            println!("vendor:      {}", inquiry.vendor);
            println!("product:     {}", inquiry.product);
            println!("revision:    {}", inquiry.revision);
            if let Some(serial) = serial {
                println!("serial:      {serial}");
            }
        }
        session.logout().await.context("logout")?;
        Ok(())
    })
}

/// Prints the capacity.
pub fn run_capacity(args: &Args) -> anyhow::Result<()> {
    let url = target_url(&args.url)?;
    block_on(async {
        let session = connect(&url, &args.session).await?;
        let capacity = session.read_capacity(url.lun).await;
        let capacity = missing_lun::checked(&session, url.lun, "READ CAPACITY", capacity).await?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "blocks": capacity.blocks,
                    "block_size": capacity.block_size,
                    "bytes": capacity.bytes(),
                    "thin_provisioned": capacity.thin_provisioned,
                })
            );
        } else {
            println!("blocks:      {}", capacity.blocks);
            println!("block size:  {}", capacity.block_size);
            println!("bytes:       {}", capacity.bytes());
            println!("thin:        {}", capacity.thin_provisioned);
        }
        session.logout().await.context("logout")?;
        Ok(())
    })
}
