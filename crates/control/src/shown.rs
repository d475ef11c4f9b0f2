//! Text that another party chose, as the log and `twill status` show it: a lease's BackendType,
//! an annotation's value, an etcd key. Whoever can write a lease or a Node chooses its length
//! too, so such text is cut to a bounded length with its full size named, and one line, or one
//! entry of `rejected_leases`, stays small whatever was written.

use std::fmt;

/// At most this many characters of a value are shown.
pub const VALUE: usize = 64;
/// At most this many characters of a whole message that may carry values are shown.
pub const LINE: usize = 1024;

/// `text` quoted (escaped as Rust's `{:?}` escapes it), cut after [`VALUE`] characters.
pub fn quoted(text: &str) -> Shown<'_> {
    Shown {
        text,
        max: VALUE,
        quoted: true,
    }
}

/// `text` as it is, cut after [`VALUE`] characters.
pub fn value(text: &str) -> Shown<'_> {
    Shown {
        text,
        max: VALUE,
        quoted: false,
    }
}

/// A whole message as it is, cut after [`LINE`] characters: the last guard of a log line or a
/// status entry, whatever its parts were.
pub fn line(text: &str) -> Shown<'_> {
    Shown {
        text,
        max: LINE,
        quoted: false,
    }
}

/// Text shown with a bound: `"abc"`, or `"abc…" (200000 bytes)` when it was cut.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    text: &'a str,
    max: usize,
    quoted: bool,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = self.text.char_indices().nth(self.max).map(|(at, _)| at);
        let shown = &self.text[..cut.unwrap_or(self.text.len())];
        match (self.quoted, cut) {
            (true, None) => write!(f, "{shown:?}"),
            (false, None) => f.write_str(shown),
            (true, Some(_)) => {
                let inner = format!("{shown:?}");
                let inner = inner.strip_suffix('"').unwrap_or(&inner);
                write!(f, "{inner}…\" ({} bytes)", self.text.len())
            }
            (false, Some(_)) => write!(f, "{shown}… ({} bytes)", self.text.len()),
        }
    }
}

impl Shown<'_> {
    /// The text as shown, owned.
    pub fn owned(self) -> String {
        self.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_shown_whole_and_long_text_cut_with_its_size() {
        assert_eq!(quoted("vxlan").to_string(), "\"vxlan\"");
        assert_eq!(value("vxlan").to_string(), "vxlan");
        let long = "A".repeat(500_000);
        let shown = quoted(&long).to_string();
        assert_eq!(shown, format!("\"{}…\" (500000 bytes)", "A".repeat(VALUE)));
        let shown = value(&long).to_string();
        assert_eq!(shown, format!("{}… (500000 bytes)", "A".repeat(VALUE)));
        assert!(line(&long).to_string().len() < LINE + 32);
    }

    #[test]
    fn text_is_cut_between_characters_and_escaped() {
        let text = format!("{}\n", "é".repeat(100));
        let shown = quoted(&text).to_string();
        assert!(
            shown.starts_with('"') && shown.ends_with("(201 bytes)"),
            "{shown}"
        );
        assert_eq!(shown.matches('é').count(), VALUE);
        assert_eq!(quoted("a\nb").to_string(), "\"a\\nb\"");
        assert!(!line(&text).to_string().is_empty());
    }
}
