//! Multi-head attention module (filled in below).
