//! cqforensics' compiled core (PyO3): the hot paths of the readers, each tested equal to the
//! Python reference it mirrors (tests/codecs/test_core.py). The Python side (`cqforensics.compiled`)
//! turns the buffers returned here into numpy arrays and Arrow columns.
//!
//! * `bindings`: the Python module `cqforensics_core` (functions, results, buffer arguments);
//! * `io`: every file read and system call (spans of files, maps, `preadv`, dropped pages);
//! * `columns`: the Arrow-layout column builders and the decode of a batch into them;
//! * the formats, each knowing nothing of Python or files: `rdq` (the shared-store walk), `qi`,
//!   `qs`, `ets` (disk_log items), `message` (stored terms) and `amqp091` (properties, tables);
//! * `etf`: external terms made into Python values (the one format whose results are Python
//!   objects: the reference's own values, for the Ra log's entries).

pub mod amqp091;
mod bindings;
pub mod columns;
pub mod etf;
pub mod ets;
pub mod io;
pub mod message;
pub mod qi;
pub mod qs;
pub mod rdq;

pub use bindings::ABI;
