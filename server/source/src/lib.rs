//! The one model-source grammar of Ferrox.
//!
//! ```text
//! hf://ORG/NAME[@REVISION][/FILE]   a Hugging Face Hub repo, or one file in it
//! pvc://CLAIM/[PATH]                a path on a PersistentVolumeClaim (operator only)
//! file:///ABS/PATH                  a local file or directory
//! https://HOST/.../NAME[?...]       one file over HTTPS
//! http://... and a plain path       the server's command line only
//! ```
//!
//! [`parse`] reads the server's `--model`; [`parse_spec`] reads what a
//! `ModelDeployment` may name, and [`SPEC_PATTERN`] is the same grammar as
//! one RE2 pattern for the CRD's CEL rule (a test holds the two together).
//! Pure: nothing here touches the file system or the network.

mod error;
mod pattern;
mod source;

pub use error::ParseError;
pub use pattern::{SPEC_PATTERN, cel_rule, pattern_of_cel_rule};
pub use source::{ModelSource, parse, parse_spec, repo_file, url_file_name};
