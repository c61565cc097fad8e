//! [`EncryptedBackstore`]: any store whose bytes are kept encrypted with
//! AES-256 in XTS mode (IEEE 1619, the mode of dm-crypt and of
//! self-encrypting drives), under a key of the LU's own. It is what makes
//! SANITIZE CRYPTOGRAPHIC ERASE (SBC-4 §4.11) honest: replacing the key
//! leaves every block written before unreadable, at once, however large
//! the LU, while the store underneath is not touched.
//!
//! Each 512-byte unit is encrypted with its unit number (byte offset / 512)
//! as the XTS tweak, so requests must be 512-byte aligned (every SCSI
//! request is: logical blocks are 512 or 4096 bytes). A unit whose stored
//! bytes are all zero was never written (a sparse file's hole, RAM not yet
//! allocated, an UNMAPped range) and reads as zeros, so the store's LBPRZ
//! stays true; a ciphertext of 512 zero bytes is a 2^-4096 event.
//!
//! The key is 64 random bytes (two AES-256 keys, XTS's data and tweak
//! keys). For a RAM LU it lives in memory (the data does too). For a file
//! or block LU it lives in a key file, created when missing (mode 0600)
//! and replaced atomically (written beside it, synced, renamed, the
//! directory synced) by a cryptographic erase, so that the erase survives
//! a crash and the data survives a restart. Whoever can read the key file
//! can read the data: keep it off the medium it protects.
//!
//! The wrapper lends nothing and names no file: a RAM store's chunks or a
//! file's extents hold ciphertext, so EXTENDED COPY and the transports go
//! through `read_at` and `write_at`, which decrypt and encrypt.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use aes::Aes256;
use aes::cipher::{Array, KeyInit};
use xts_mode::{Xts128, get_tweak_default};

use iscsi_scsi::backstore::Backstore;

/// The XTS data unit: the smallest logical block.
const UNIT: usize = 512;
/// Bytes of key material: the data key and the tweak key, 32 each.
pub const KEY_LEN: usize = 64;

/// Where the key is kept.
#[derive(Debug)]
enum KeyHome {
    /// In memory only (a RAM LU).
    Memory,
    /// In this file (a file or block LU).
    File(PathBuf),
}

/// A store kept encrypted under a key that CRYPTOGRAPHIC ERASE replaces.
pub struct EncryptedBackstore {
    inner: Arc<dyn Backstore>,
    cipher: RwLock<Arc<Xts128<Aes256>>>,
    home: KeyHome,
}

impl std::fmt::Debug for EncryptedBackstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedBackstore")
            .field("inner", &self.inner)
            .field("key", &self.home)
            .finish_non_exhaustive()
    }
}

impl EncryptedBackstore {
    /// `inner` under a new random key held in memory (its data cannot
    /// outlive the process: meant for RAM stores).
    pub fn with_memory_key(inner: Arc<dyn Backstore>) -> io::Result<Self> {
        Ok(EncryptedBackstore {
            inner,
            cipher: RwLock::new(Arc::new(cipher(&random_key()?))),
            home: KeyHome::Memory,
        })
    }

    /// `inner` under the key in `key_file`, which is created with a new
    /// random key when it does not exist. A key file of another length is
    /// refused: a wrong key would read garbage and write more of it.
    pub fn with_key_file(inner: Arc<dyn Backstore>, key_file: &Path) -> io::Result<Self> {
        let key = match File::open(key_file) {
            Ok(mut file) => {
                let mut key = Vec::with_capacity(KEY_LEN + 1);
                Read::by_ref(&mut file)
                    .take(KEY_LEN as u64 + 1)
                    .read_to_end(&mut key)?;
                <[u8; KEY_LEN]>::try_from(key.as_slice()).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "key file {}: {} bytes, not {KEY_LEN}",
                            key_file.display(),
                            key.len()
                        ),
                    )
                })?
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let key = random_key()?;
                store_key(key_file, &key)?;
                key
            }
            Err(error) => return Err(error),
        };
        Ok(EncryptedBackstore {
            inner,
            cipher: RwLock::new(Arc::new(cipher(&key))),
            home: KeyHome::File(key_file.to_owned()),
        })
    }

    fn current(&self) -> Arc<Xts128<Aes256>> {
        Arc::clone(&self.cipher.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// `buf` encrypted for byte `offset`.
    fn encrypt(&self, offset: u64, buf: &[u8]) -> io::Result<Vec<u8>> {
        let first = unit_of(offset, buf.len())?;
        let mut sealed = buf.to_vec();
        self.current()
            .encrypt_area(&mut sealed, UNIT, first, get_tweak_default);
        Ok(sealed)
    }
}

/// The number of the unit at byte `offset`, if `offset` and `len` are
/// whole units.
fn unit_of(offset: u64, len: usize) -> io::Result<u128> {
    if !offset.is_multiple_of(UNIT as u64) || !len.is_multiple_of(UNIT) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("an encrypted store takes whole 512-byte units, not {len} bytes at {offset}"),
        ));
    }
    Ok(u128::from(offset / UNIT as u64))
}

fn cipher(key: &[u8; KEY_LEN]) -> Xts128<Aes256> {
    let key: Array<u8, aes::cipher::consts::U64> = Array(*key);
    let (data_key, tweak_key) = key.split::<aes::cipher::consts::U32>();
    Xts128::new(Aes256::new(&data_key), Aes256::new(&tweak_key))
}

fn random_key() -> io::Result<[u8; KEY_LEN]> {
    let mut key = [0u8; KEY_LEN];
    getrandom::fill(&mut key).map_err(|e| io::Error::other(format!("no random key: {e}")))?;
    Ok(key)
}

/// Writes `key` to `path` so that a crash leaves the old key or the new
/// one, never a mix: a temporary file beside it (mode 0600), synced,
/// renamed over it, the directory synced.
fn store_key(path: &Path, key: &[u8; KEY_LEN]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".new");
    let temporary = dir.join(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(key)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    File::open(dir)?.sync_all()
}

impl Backstore for EncryptedBackstore {
    // What does not touch the data goes straight through: the geometry,
    // flush, unmap (unmapped units read as zeros here too, so block erase
    // stays honest), and atomic writes (each write is one write of the
    // store's, of the ciphertext). Not lend, file or copy_from: the store
    // holds ciphertext (see the module doc); nor compare_and_write or
    // write_same, which would compare or repeat ciphertext (each unit's
    // tweak differs), so those run here through read_at and write_at.
    delegate!(inner =>
        block_size, block_count, flush, unmap, unique_id, is_thin, may_block, unmap_granularity,
        allocation_status, atomic_write_max, can_block_erase, lu_options, take_capacity_change,
        resize, shared_pr,
        alua,
    );

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let first = unit_of(offset, buf.len())?;
        self.inner.read_at(offset, buf)?;
        let cipher = self.current();
        for (i, unit) in buf.chunks_exact_mut(UNIT).enumerate() {
            // Never written: reads as zeros (see the module doc).
            if unit.iter().all(|&b| b == 0) {
                continue;
            }
            cipher.decrypt_sector(unit, get_tweak_default(first + i as u128));
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let sealed = self.encrypt(offset, buf)?;
        self.inner.write_at(offset, &sealed)
    }

    fn write_through(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let sealed = self.encrypt(offset, buf)?;
        self.inner.write_through(offset, &sealed)
    }

    fn can_crypto_erase(&self) -> bool {
        true
    }

    fn crypto_erase(&self) -> io::Result<()> {
        let key = random_key()?;
        if let KeyHome::File(path) = &self.home {
            store_key(path, &key)?;
        }
        *self.cipher.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(cipher(&key));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileBackstore, RamBackstore};

    fn ram(size: u64) -> Arc<dyn Backstore> {
        Arc::new(RamBackstore::new(size, 512, 7).unwrap())
    }

    #[test]
    fn reads_what_was_written_and_stores_only_ciphertext() {
        let inner = ram(1 << 20);
        let store = EncryptedBackstore::with_memory_key(Arc::clone(&inner)).unwrap();
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        store.write_at(4096, &data).unwrap();
        let mut back = vec![0u8; 8192];
        store.read_at(4096, &mut back).unwrap();
        assert_eq!(back, data);
        let mut raw = vec![0u8; 8192];
        inner.read_at(4096, &mut raw).unwrap();
        assert_ne!(raw, data);
        // The same plaintext at another offset is another ciphertext.
        assert_ne!(raw[..512], raw[512 * 251 % 8192..][..512]);
        // Zeros written are stored encrypted, and read back as zeros.
        store.write_at(0, &[0; 1024]).unwrap();
        inner.read_at(0, &mut raw[..1024]).unwrap();
        assert!(raw[..1024].iter().any(|&b| b != 0));
        store.read_at(0, &mut back[..1024]).unwrap();
        assert!(back[..1024].iter().all(|&b| b == 0));
    }

    #[test]
    fn never_written_and_unmapped_units_read_as_zeros() {
        let store = EncryptedBackstore::with_memory_key(ram(1 << 20)).unwrap();
        let mut back = vec![1u8; 4096];
        store.read_at(65536, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        store.write_at(65536, &[9; 4096]).unwrap();
        store.unmap(0, 1 << 20).unwrap();
        store.read_at(65536, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_crypto_erase_leaves_old_data_unreadable_and_new_data_readable() {
        let store = EncryptedBackstore::with_memory_key(ram(1 << 20)).unwrap();
        store.write_at(0, &[b'a'; 4096]).unwrap();
        store.crypto_erase().unwrap();
        let mut back = vec![0u8; 4096];
        store.read_at(0, &mut back).unwrap();
        assert!(back.chunks(512).all(|unit| unit != [b'a'; 512]));
        store.write_at(0, &[b'b'; 4096]).unwrap();
        store.read_at(0, &mut back).unwrap();
        assert_eq!(back, [b'b'; 4096]);
    }

    #[test]
    fn unaligned_requests_are_refused() {
        let store = EncryptedBackstore::with_memory_key(ram(1 << 20)).unwrap();
        let error = store.write_at(100, &[1; 512]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let error = store.read_at(0, &mut [0; 100]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_key_file_keeps_the_data_across_opens_until_an_erase() {
        let dir = std::env::temp_dir().join(format!("iscsi-rs-encrypted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (image, key) = (dir.join("lu.img"), dir.join("lu.key"));
        let open = || -> EncryptedBackstore {
            let file = FileBackstore::open(image.to_str().unwrap(), Some(1 << 20), 512, 1).unwrap();
            EncryptedBackstore::with_key_file(Arc::new(file), &key).unwrap()
        };
        open().write_at(512, &[b'k'; 1024]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut back = vec![0u8; 1024];
        open().read_at(512, &mut back).unwrap();
        assert_eq!(back, [b'k'; 1024], "the key file kept the key");
        let before = std::fs::read(&key).unwrap();
        open().crypto_erase().unwrap();
        assert_ne!(std::fs::read(&key).unwrap(), before);
        open().read_at(512, &mut back).unwrap();
        assert_ne!(back, [b'k'; 1024], "the erase outlived the process");
        // A key file of the wrong length is refused.
        std::fs::write(&key, [0u8; 10]).unwrap();
        let file = FileBackstore::open(image.to_str().unwrap(), None, 512, 1).unwrap();
        let error = EncryptedBackstore::with_key_file(Arc::new(file), &key).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
