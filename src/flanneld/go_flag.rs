//! Go's `flag` package, as flanneld parses its command line with it: `-flag` and `--flag` alike,
//! `-flag=value` and `-flag value`, a boolean as `-flag` or `-flag=false` (never taking the next
//! argument), the last of a repeated flag winning (a list flag collecting each), and parsing
//! ending at the first argument that is not a flag, or after `--`. The errors are Go's, so an
//! operator who searches for one finds flag's documentation.

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `-flag` (true) or `-flag=VALUE` in Go's `strconv.ParseBool` spelling.
    Bool,
    /// `-flag VALUE` or `-flag=VALUE`.
    Value,
}

/// One flag of a flag set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
}

/// The flags given, in order, each with its value.
pub type Assignments = Vec<(&'static str, String)>;

/// A command line read against a flag set.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// `-h`, `-help` or `--help` (undefined flags of those names, as in Go): print the usage.
    Help,
    /// The flags given, in order (a boolean's value already checked), and the arguments after
    /// the flags.
    Flags { set: Assignments, rest: Vec<String> },
}

/// Reads `args` (without the program name) against `specs`, as `flag.FlagSet.Parse` does.
pub fn parse(specs: &[Spec], args: &[String]) -> Result<Parsed, String> {
    let mut set = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.clone().next() {
        let Some(dashes) = flag_dashes(arg) else {
            break;
        };
        args.next();
        if arg == "--" {
            break;
        }
        let body = &arg[dashes..];
        if body.starts_with('-') || body.starts_with('=') {
            return Err(format!("bad flag syntax: {arg}"));
        }
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let Some(spec) = specs.iter().find(|s| s.name == name) else {
            if name == "help" || name == "h" {
                return Ok(Parsed::Help);
            }
            return Err(format!("flag provided but not defined: -{name}"));
        };
        let value = match (spec.kind, value) {
            (Kind::Bool, None) => "true".to_string(),
            (Kind::Bool, Some(value)) => match parse_bool(value) {
                Some(b) => b.to_string(),
                None => {
                    return Err(format!(
                        "invalid boolean value {value:?} for -{name}: parse error"
                    ))
                }
            },
            (Kind::Value, Some(value)) => value.to_string(),
            (Kind::Value, None) => match args.next() {
                Some(next) => next.clone(),
                None => return Err(format!("flag needs an argument: -{name}")),
            },
        };
        set.push((spec.name, value));
    }
    Ok(Parsed::Flags {
        set,
        rest: args.cloned().collect(),
    })
}

/// How many dashes start a flag argument (one or two); `None` for an argument that is not a
/// flag (`-` alone is not one, as in Go).
fn flag_dashes(arg: &str) -> Option<usize> {
    match arg.as_bytes() {
        [b'-', b'-', ..] => Some(2),
        [b'-', _, ..] => Some(1),
        _ => None,
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseInt(text, 0, 64)`, which `flag.IntVar` uses: an optional sign, then
/// decimal, `0x` hexadecimal, `0o` or a leading `0` octal, or `0b` binary, with `_` allowed
/// between digits and after a base prefix.
pub fn parse_int(text: &str) -> Option<i64> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if !underscores_ok(unsigned) {
        return None;
    }
    let plain: String = unsigned.chars().filter(|&c| c != '_').collect();
    let lower = plain.to_ascii_lowercase();
    let (radix, digits) = match lower.as_bytes() {
        [b'0', b'x', ..] => (16, &lower[2..]),
        [b'0', b'b', ..] => (2, &lower[2..]),
        [b'0', b'o', ..] => (8, &lower[2..]),
        [b'0', _, ..] => (8, &lower[1..]),
        _ => (10, lower.as_str()),
    };
    // from_str_radix would take a second sign.
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// Go's `underscoreOK`: `_` only between digits, or between a base prefix and a digit.
fn underscores_ok(unsigned: &str) -> bool {
    let bytes = unsigned.as_bytes();
    let prefixed = bytes.len() >= 2
        && bytes[0] == b'0'
        && matches!(bytes[1].to_ascii_lowercase(), b'b' | b'o' | b'x');
    let hex = prefixed && bytes[1].eq_ignore_ascii_case(&b'x');
    // What came last: the start, a digit (or the base prefix), an underscore, anything else.
    let (mut saw_digit, mut saw_underscore) = (prefixed, false);
    for &b in &bytes[if prefixed { 2 } else { 0 }..] {
        if b.is_ascii_digit() || (hex && b.is_ascii_hexdigit()) {
            (saw_digit, saw_underscore) = (true, false);
        } else if b == b'_' {
            if !saw_digit {
                return false;
            }
            (saw_digit, saw_underscore) = (false, true);
        } else if saw_underscore {
            return false;
        } else {
            saw_digit = false;
        }
    }
    !saw_underscore
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[Spec] = &[
        Spec {
            name: "ip-masq",
            kind: Kind::Bool,
        },
        Spec {
            name: "iface",
            kind: Kind::Value,
        },
    ];

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn flags(line: &str) -> Result<(Assignments, Vec<String>), String> {
        match parse(SPECS, &args(line))? {
            Parsed::Flags { set, rest } => Ok((set, rest)),
            Parsed::Help => Err("help".into()),
        }
    }

    fn set(pairs: &[(&'static str, &str)]) -> Assignments {
        pairs.iter().map(|&(n, v)| (n, v.to_string())).collect()
    }

    #[test]
    fn every_spelling_go_takes_is_taken() {
        let (got, rest) = flags("-ip-masq --iface eth0 -iface=10.0.0.1 --iface=eth1").unwrap();
        let want = set(&[
            ("ip-masq", "true"),
            ("iface", "eth0"),
            ("iface", "10.0.0.1"),
            ("iface", "eth1"),
        ]);
        assert_eq!((got, rest), (want, vec![]));
        let (got, _) = flags("--ip-masq=false -ip-masq=T -ip-masq=0").unwrap();
        assert_eq!(
            got,
            set(&[
                ("ip-masq", "false"),
                ("ip-masq", "true"),
                ("ip-masq", "false")
            ])
        );
        // A value may itself start with a dash, and may be empty.
        let (got, _) = flags("-iface -x -iface=").unwrap();
        assert_eq!(got, set(&[("iface", "-x"), ("iface", "")]));
    }

    #[test]
    fn parsing_ends_at_the_first_argument_that_is_not_a_flag() {
        let (got, rest) = flags("-ip-masq false -iface eth0").unwrap();
        assert_eq!(got, set(&[("ip-masq", "true")]));
        assert_eq!(rest, args("false -iface eth0"));
        let (got, rest) = flags("-iface eth0 -- -ip-masq").unwrap();
        assert_eq!((got, rest), (set(&[("iface", "eth0")]), args("-ip-masq")));
        let (_, rest) = flags("- -ip-masq").unwrap();
        assert_eq!(rest, args("- -ip-masq"));
        assert_eq!(flags("").unwrap(), (vec![], vec![]));
    }

    #[test]
    fn errors_are_gos() {
        let err = |line: &str| flags(line).unwrap_err();
        assert_eq!(err("-ip-masqq"), "flag provided but not defined: -ip-masqq");
        assert_eq!(
            err("--kube-subnet-mgr"),
            "flag provided but not defined: -kube-subnet-mgr"
        );
        assert_eq!(err("-iface"), "flag needs an argument: -iface");
        assert_eq!(
            err("-ip-masq=yes"),
            "invalid boolean value \"yes\" for -ip-masq: parse error"
        );
        assert_eq!(err("---iface"), "bad flag syntax: ---iface");
        assert_eq!(err("-=x"), "bad flag syntax: -=x");
        for help in ["-h", "--help", "-help"] {
            assert_eq!(flags(help).unwrap_err(), "help", "{help}");
        }
    }

    #[test]
    fn integers_are_read_as_go_reads_them() {
        for (text, want) in [
            ("8081", Some(8081)),
            ("+5", Some(5)),
            ("-1", Some(-1)),
            ("0x1F", Some(31)),
            ("0X1f", Some(31)),
            ("010", Some(8)),
            ("0o10", Some(8)),
            ("0b101", Some(5)),
            ("0x_1_F", Some(31)),
            ("0", Some(0)),
            ("1_000", Some(1000)),
            ("0_7", Some(7)),
            ("_1", None),
            ("1_", None),
            ("+-1", None),
            ("--1", None),
            ("0x", None),
            ("08", None),
            ("", None),
            ("5s", None),
            ("0x1__F", None),
            ("99999999999999999999", None),
            ("-9223372036854775808", Some(i64::MIN)),
        ] {
            assert_eq!(parse_int(text), want, "{text:?}");
        }
    }
}
