//! Settings whose value is one of a fixed set of names.
//!
//! [`named_setting!`] declares such an enum once: its variants with their
//! spellings, `ALL`, `name`, `Display`, serde under the same spellings, and a
//! `FromStr` that refuses any other text with the shared `ConfigError` naming
//! the setting's key. Flags (through [`super::parse`]) and TOML files read the
//! same spellings, so a value is written one way everywhere.

/// Declares a setting enum `NAME for "key" { Variant = "spelling", … }`.
macro_rules! named_setting {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident for $key:literal {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in the order the help text lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling in flags and files.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = tiderec_operators::ConfigError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    let names: Vec<&str> = $name::ALL.iter().map(|v| v.name()).collect();
                    tiderec_operators::ConfigError::new($key, format!("`{s}` is not one of {}", names.join(", ")))
                })
            }
        }
    };
}

pub(crate) use named_setting;
