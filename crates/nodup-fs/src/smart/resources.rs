//! Resource readings for `smart`'s adaptation (SmartDedup §3.4): CPU utilisation from
//! `/proc/stat`, utilisation of the device under the image from `/proc/diskstats`, the battery
//! level from `/sys/class/power_supply` when the machine has one. An operator (or an
//! experiment) can set any of them through the control interface; a value set stays until it
//! is set back to `auto`.

use std::path::Path;
use std::time::Instant;

use nodup_core::policy::smart::Resources;

/// Values set through the control interface (`None`: measured).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Overrides {
    /// Battery level 0..=100.
    pub battery: Option<f64>,
    /// Low-power mode.
    pub low_power: Option<bool>,
    /// CPU utilisation 0..=1.
    pub cpu_busy: Option<f64>,
    /// Device utilisation 0..=1.
    pub device_busy: Option<f64>,
}

/// Samples the machine.
#[derive(Debug)]
pub struct Sampler {
    cpu: Option<(u64, u64)>,
    disk: Option<(u64, Instant)>,
    /// The image's block device as named in /proc/diskstats.
    dev: Option<String>,
}

impl Sampler {
    /// A sampler for the device holding `image` (none: no device utilisation).
    pub fn new(image: Option<&Path>) -> Sampler {
        Sampler {
            cpu: None,
            disk: None,
            dev: image.and_then(device_of),
        }
    }

    /// Readings now, with `ov` applied.
    pub fn sample(&mut self, ov: &Overrides) -> Resources {
        let cpu = self.cpu_busy();
        let dev = self.device_busy();
        Resources {
            battery: ov.battery.or_else(battery_level),
            low_power: ov.low_power.unwrap_or(false),
            cpu_busy: ov.cpu_busy.unwrap_or(cpu),
            device_busy: ov.device_busy.unwrap_or(dev),
        }
    }

    fn cpu_busy(&mut self) -> f64 {
        let Ok(s) = std::fs::read_to_string("/proc/stat") else {
            return 0.0;
        };
        let Some(line) = s.lines().next() else {
            return 0.0;
        };
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() < 5 {
            return 0.0;
        }
        let total: u64 = v.iter().sum();
        // idle + iowait
        let idle = v[3] + v[4];
        let busy = total - idle;
        let r = match self.cpu {
            Some((b0, t0)) if total > t0 => (busy - b0.min(busy)) as f64 / (total - t0) as f64,
            _ => 0.0,
        };
        self.cpu = Some((busy, total));
        r.clamp(0.0, 1.0)
    }

    fn device_busy(&mut self) -> f64 {
        let Some(dev) = &self.dev else { return 0.0 };
        let Ok(s) = std::fs::read_to_string("/proc/diskstats") else {
            return 0.0;
        };
        // Field 13 (1-based, after major, minor, name): milliseconds spent doing I/O.
        let ms = s.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 12 && f[2] == dev).then(|| f[12].parse::<u64>().ok())?
        });
        let Some(ms) = ms else { return 0.0 };
        let now = Instant::now();
        let r = match self.disk {
            Some((m0, t0)) => {
                let el = now.duration_since(t0).as_millis().max(1) as f64;
                (ms.saturating_sub(m0)) as f64 / el
            }
            None => 0.0,
        };
        self.disk = Some((ms, now));
        r.clamp(0.0, 1.0)
    }
}

/// The name in /proc/diskstats of the block device holding `path`.
fn device_of(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    link.file_name()?.to_str().map(str::to_string)
}

/// The charge of the first battery, 0..=100.
pub fn battery_level() -> Option<f64> {
    let dir = std::fs::read_dir("/sys/class/power_supply").ok()?;
    for e in dir.flatten() {
        let p = e.path();
        let kind = std::fs::read_to_string(p.join("type")).unwrap_or_default();
        if kind.trim() == "Battery" {
            if let Ok(c) = std::fs::read_to_string(p.join("capacity")) {
                if let Ok(v) = c.trim().parse::<f64>() {
                    return Some(v);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_and_readings_are_fractions() {
        let mut s = Sampler::new(None);
        let ov = Overrides {
            battery: Some(40.0),
            low_power: Some(true),
            cpu_busy: None,
            device_busy: Some(0.5),
        };
        let r = s.sample(&ov);
        assert_eq!(r.battery, Some(40.0));
        assert!(r.low_power);
        assert_eq!(r.device_busy, 0.5);
        let r2 = s.sample(&Overrides::default());
        assert!((0.0..=1.0).contains(&r2.cpu_busy));
        assert!(!r2.low_power);
    }
}
