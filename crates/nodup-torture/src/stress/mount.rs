//! Threads through the kernel on a real mount.

use std::sync::Arc;
use std::time::Instant;

use super::{final_check, run_workers, DirTarget, StressStats, StressTarget};

/// Stress on a real mount: mkfs + mount with the `nodup` binary, threads through the kernel,
/// model check, clean unmount, `nodup fsck`, remount and model check again.
pub fn mount_stress(
    nodup: &std::path::Path,
    workdir: &std::path::Path,
    threads: usize,
    seed: u64,
    dur: std::time::Duration,
) -> StressStats {
    use crate::kill9::{detach, mount_image, run};
    use std::process::Command;
    let mut st = StressStats::default();
    let img = workdir.join("stress.img");
    let mp = workdir.join("mnt");
    let log = workdir.join("daemon.log");
    detach(&mp);
    if let Err(e) = std::fs::create_dir_all(&mp) {
        st.bad(format!("workdir: {e}"));
        return st;
    }
    if let Err(e) = run(Command::new(nodup)
        .arg("mkfs")
        .arg(&img)
        .args(["--size", "256M"]))
    {
        st.bad(format!("mkfs: {e}"));
        return st;
    }
    if let Err(e) = mount_image(nodup, &img, &mp, &log) {
        st.bad(format!("mount: {e}"));
        return st;
    }
    let t: Arc<dyn StressTarget> = Arc::new(DirTarget(mp.clone()));
    let deadline = Instant::now() + dur;
    // `fstrim` through the kernel while the workers write, delete and read.
    let trimmer = {
        let (nodup_mp, deadline) = (mp.clone(), deadline);
        std::thread::spawn(move || -> Result<u64, String> {
            let mut runs = 0;
            while Instant::now() < deadline {
                run(Command::new("fstrim").arg(&nodup_mp)).map_err(|e| format!("fstrim: {e}"))?;
                runs += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Ok(runs)
        })
    };
    let (s1, model, none) = run_workers(t.clone(), threads, seed, deadline, 24, false);
    st.merge(s1);
    match trimmer.join() {
        Ok(Ok(runs)) if runs > 0 => {}
        Ok(Ok(_)) => st.bad("fstrim never ran".into()),
        Ok(Err(e)) => st.bad(e),
        Err(_) => st.bad("the fstrim thread panicked".into()),
    }
    if let Err(e) = run(Command::new(nodup).arg("umount").arg(&mp)) {
        st.bad(format!("umount: {e}"));
        detach(&mp);
    }
    if let Err(e) = run(Command::new(nodup).arg("fsck").arg(&img)) {
        st.bad(format!("fsck after stress: {e}"));
    }
    match mount_image(nodup, &img, &mp, &log) {
        Ok(_) => {
            final_check(&*t, &model, &none, &mut st);
            if let Err(e) = run(Command::new(nodup).arg("umount").arg(&mp)) {
                st.bad(format!("umount: {e}"));
                detach(&mp);
            }
        }
        Err(e) => st.bad(format!("remount: {e}")),
    }
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(workdir);
    st
}
