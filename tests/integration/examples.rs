//! The examples of `examples/`, run as their README says: each app started through its `run.sh`
//! against a real redis-server (with the module, or without it for the Functions-library
//! fallback), driven over HTTP by httpx (`examples/drive.py`, in the FastAPI example's
//! virtualenv), and the Prometheus exporter scraped.
//!
//! Each `run.sh install` runs once per test run (the dependencies go into the example's folder
//! and stay there: a few seconds the first time after a fresh clone... or a minute, then nothing).
//! Where an install fails (no python3 or npm, or no package registry), the tests that need it
//! skip, saying why. Every app and exporter runs in its own process group, killed on Drop.

mod apps;
mod harness;
mod prometheus;
