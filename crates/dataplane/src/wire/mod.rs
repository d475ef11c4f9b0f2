//! Zero-copy packet views and emitters, in the style of smoltcp: a view checks its bounds once
//! in `new_checked`, and accessors then read fields in place.

pub mod ipv4;
