//! The one test kit every integration test uses: the shared services and
//! how to reach them, per-test topics and processes, a reference fold,
//! changelog and store readers (the crates' own read halves), and load
//! producers. No test file defines a helper of its own.

pub mod browser;
pub mod changelog;
pub mod checks;
pub mod dashboard;
pub mod env;
pub mod load;
pub mod reference;
pub mod services;
pub mod stores;
pub mod sweep;
pub mod terminal;
pub mod ws;

pub use changelog::Changelog;
pub use checks::*;
pub use dashboard::*;
pub use env::*;
pub use load::*;
pub use reference::*;
pub use services::*;
pub use stores::*;
pub use terminal::*;
pub use ws::*;
