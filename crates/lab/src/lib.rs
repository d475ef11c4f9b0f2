//! TODO(lab helper)
