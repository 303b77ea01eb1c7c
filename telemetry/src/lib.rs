//! vcp-telemetry: how vcp's binaries log. Both `vcp` and `vcp-syncer` take `--log-format`
//! ([`LogFormat`]) and call [`init`] once from main: tracing events go to stderr, filtered by
//! `RUST_LOG` (the binary's default level otherwise), as text for people or as JSON lines, with
//! the current span's fields (`tenant`, `caller`, ...), for a log pipeline.
//!
//! stderr, because stdout is for what a person must read: the first admin token, `migrate`'s
//! result, a client command's answer.

use std::io::Write;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per event, with its span's fields (`tenant`, `caller`, ...).
    Json,
}

/// The subscriber for `format`, writing to `writer`; `default_level` applies when `RUST_LOG`
/// is unset or invalid.
pub fn subscriber<W>(
    format: LogFormat,
    default_level: &str,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(fmt.finish()),
        // The current span's fields on every line, and the chain of spans it is in.
        LogFormat::Json => Box::new(
            fmt.json()
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

/// Installs the subscriber for the process (on stderr), with the bridge that turns `log`
/// records (rustls's, say) into events.
pub fn init(format: LogFormat, default_level: &str) {
    let s = subscriber(format, default_level, std::io::stderr);
    if s.try_init().is_err() {
        // Only a second call gets here; the first subscriber stays.
        let _ = writeln!(std::io::stderr(), "logging was already set up");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    fn log(format: LogFormat) -> String {
        let buf = Buffer::default();
        tracing::subscriber::with_default(subscriber(format, "info", buf.clone()), || {
            let span = tracing::info_span!("pass", tenant = "team-a");
            let _in = span.enter();
            tracing::info!(phase = "Ready", "pass done");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_logs_are_one_object_per_line_with_the_span_fields() {
        let out = log(LogFormat::Json);
        let line: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
        assert_eq!(line["fields"]["message"], "pass done");
        assert_eq!(line["fields"]["phase"], "Ready");
        assert_eq!(line["span"]["tenant"], "team-a");
        assert_eq!(line["level"], "INFO");
    }

    #[test]
    fn text_logs_are_for_people() {
        let out = log(LogFormat::Text);
        assert!(out.contains("pass done"), "{out}");
        assert!(out.contains("team-a"), "{out}");
        assert!(serde_json::from_str::<serde_json::Value>(out.trim()).is_err());
    }
}
