//! Container-side building blocks of the container rung.

pub mod tools;
