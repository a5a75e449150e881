//! A block file's log records held back in memory (`log/held.rs`) against a checkpoint running
//! alongside: operations go on once its cut is taken, and the releases they leave are given
//! back after its superblock switch, so the records that made them must be on the medium (and
//! fenced) by then. helper-59's review of session 47 found them still held there: a block
//! given back while the durable image still named it, reused by another file after a crash.

mod common;
use common::{block, create};

use nodup_core::media::{CrashMode, CrashSim, Medium, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{FileSystem, FsOptions, MediumKind};
use std::sync::{Arc, Condvar, Mutex};

/// The name of the thread the checkpoint runs on, whose writes [`Pause`] counts.
const CKPT: &str = "ckpt";

/// A medium that records the order of the checkpoint thread's writes and fences, and can stop
/// that thread at its `n`th write until released.
struct Pause {
    inner: Arc<CrashSim>,
    events: Mutex<Vec<char>>,
    stop_at: Mutex<Option<usize>>,
    /// (the thread waits here, it was told to go on)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Pause {
    fn on_ckpt_thread() -> bool {
        std::thread::current().name() == Some(CKPT)
    }
    fn note(&self, e: char) {
        if !Self::on_ckpt_thread() {
            return;
        }
        let n = {
            let mut ev = self.events.lock().unwrap();
            ev.push(e);
            ev.iter().filter(|&&c| c == 'w').count()
        };
        if e == 'w' && *self.stop_at.lock().unwrap() == Some(n) {
            let mut st = self.state.lock().unwrap();
            st.0 = true;
            self.cv.notify_all();
            while !st.1 {
                st = self.cv.wait(st).unwrap();
            }
        }
    }
    fn wait_stopped(&self) {
        let mut st = self.state.lock().unwrap();
        while !st.0 {
            st = self.cv.wait(st).unwrap();
        }
    }
    fn go_on(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Medium for Pause {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> nodup_core::Result<()> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> nodup_core::Result<()> {
        self.note('w');
        self.inner.write(off, data)
    }
    fn flush(&self, off: u64, len: u64) {
        self.inner.flush(off, len)
    }
    fn fence(&self) -> nodup_core::Result<()> {
        self.note('f');
        self.inner.fence()
    }
    fn sync_all(&self) -> nodup_core::Result<()> {
        self.inner.sync_all()
    }
    fn kind(&self) -> &'static str {
        "pause"
    }
}

/// File "f" (one block, synced and checkpointed), the file system, its medium.
fn setup(stop_at: Option<usize>) -> (Arc<CrashSim>, Arc<Pause>, FileSystem, u64) {
    let sim = Arc::new(CrashSim::new(16 << 20));
    let p = Arc::new(Pause {
        inner: sim.clone(),
        events: Mutex::new(Vec::new()),
        stop_at: Mutex::new(stop_at),
        state: Mutex::new((false, false)),
        cv: Condvar::new(),
    });
    let fs = common::format(p.clone(), MediumKind::BlockFile);
    let ino = create(&fs, "f");
    fs.write(ino, 0, &block(1)).unwrap();
    fs.sync().unwrap();
    fs.checkpoint(false).unwrap();
    (sim, p, fs, ino)
}

#[test]
fn a_checkpoint_gives_back_a_release_only_once_its_record_is_durable() {
    // A dry run: which of the checkpoint thread's writes is the last before its fence for the
    // superblock switch (its first fence: nothing is held back or unfenced at its start).
    let stop = {
        let (_, p, fs, _) = setup(None);
        let fs = Arc::new(fs);
        let f2 = fs.clone();
        std::thread::Builder::new()
            .name(CKPT.into())
            .spawn(move || f2.checkpoint(false).unwrap())
            .unwrap()
            .join()
            .unwrap();
        let ev = p.events.lock().unwrap();
        let first_fence = ev.iter().position(|&c| c == 'f').expect("a fence");
        let writes = ev[..first_fence].iter().filter(|&&c| c == 'w').count();
        assert!(writes > 0, "no write before the switch's fence: {ev:?}");
        writes
    };
    let (sim, p, fs, ino) = setup(Some(stop));
    let fs = Arc::new(fs);
    let f2 = fs.clone();
    let ckpt = std::thread::Builder::new()
        .name(CKPT.into())
        .spawn(move || f2.checkpoint(false).unwrap())
        .unwrap();
    // Stopped after its cut (the gate is free), before it takes the waiting releases.
    p.wait_stopped();
    let used = |fs: &FileSystem| fs.engine().stats().physical_bytes / BLOCK_SIZE as u64;
    let before = used(&fs);
    fs.write(ino, 0, &block(2)).unwrap();
    assert_eq!(
        used(&fs),
        before + 1,
        "the replaced block waits for durability"
    );
    p.go_on();
    ckpt.join().unwrap();
    assert_eq!(
        used(&fs),
        before,
        "the checkpoint gave the replaced block back"
    );
    // So the record that replaced it must be durable: a crash now shows the new contents.
    let img = sim.crash_point().materialize(&CrashMode::DropAll);
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let crashed = FileSystem::open(m, &FsOptions::default()).unwrap();
    let f = crashed.lookup(ROOT_INO, b"f").unwrap().0;
    let got = crashed.read(f, 0, BLOCK_SIZE).unwrap();
    assert!(
        got == block(2),
        "a crash after the checkpoint shows the replaced contents, whose block was given back"
    );
}
