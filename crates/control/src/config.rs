//! TODO(control helper)
