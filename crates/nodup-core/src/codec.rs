//! Codecs shared by every on-media format and option of the workspace: little-endian field
//! access at named offsets, and the name/number codec of the option enums ([`named_enum!`]).

/// The u32 stored little-endian at `b[o..o + 4]`. Callers read fixed-size buffers whose
/// length the format already checked; a short slice is a bug and panics.
#[inline]
pub fn le_u32(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

/// The u64 stored little-endian at `b[o..o + 8]` (see [`le_u32`] on lengths).
#[inline]
pub fn le_u64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Store `v` little-endian at `b[o..o + 4]`.
#[inline]
pub fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// Store `v` little-endian at `b[o..o + 8]`.
#[inline]
pub fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Declares a fieldless enum whose variants each have a number (its on-media value) and a
/// name (command line, stats), with `ALL` (declaration order), `name()`, `from_name()` and
/// `from_u32()`:
///
/// ```
/// nodup_core::named_enum! {
///     /// How loud.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Volume {
///         /// Quiet.
///         Low = 1 => "low",
///         High = 2 => "high",
///     }
/// }
/// assert_eq!(Volume::from_name("high"), Some(Volume::High));
/// assert_eq!(Volume::from_u32(1).map(Volume::name), Some("low"));
/// assert_eq!(Volume::ALL, [Volume::Low, Volume::High]);
/// ```
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident {
            $( $(#[$vmeta:meta])* $var:ident = $num:literal => $name:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $ty {
            $( $(#[$vmeta])* $var = $num ),+
        }

        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: [$ty; [$($num),+].len()] = [$($ty::$var),+];

            /// Name used on the command line and in stats.
            pub fn name(self) -> &'static str {
                match self {
                    $( $ty::$var => $name ),+
                }
            }

            /// Parse a command-line name.
            pub fn from_name(s: &str) -> Option<$ty> {
                Self::ALL.into_iter().find(|k| k.name() == s)
            }

            /// Decode the on-media value.
            pub fn from_u32(v: u32) -> Option<$ty> {
                Self::ALL.into_iter().find(|k| *k as u32 == v)
            }
        }
    };
}
