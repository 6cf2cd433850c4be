//! The Prometheus text format, one family at a time: its `# HELP` and
//! `# TYPE` lines, then its samples, label values escaped. Every family the
//! agent exports is written through this one writer (the agent's own, the
//! prober's, the eBPF counters).

use std::fmt::{Display, Write as _};

/// A metric family's type.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A scrape's text, written family by family.
#[derive(Default)]
pub(crate) struct Exposition {
    out: String,
}

impl Exposition {
    pub(crate) fn into_string(self) -> String {
        self.out
    }

    /// Starts a family: its HELP and TYPE lines. Its samples follow,
    /// through the [`Family`] returned.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.name()
        );
        Family {
            out: &mut self.out,
            name: name.to_string(),
        }
    }

    /// A counter without labels.
    pub(crate) fn counter(&mut self, name: &str, help: &str, v: impl Display) {
        self.family(name, Kind::Counter, help).value(v);
    }

    /// A gauge without labels.
    pub(crate) fn gauge(&mut self, name: &str, help: &str, v: impl Display) {
        self.family(name, Kind::Gauge, help).value(v);
    }

    /// A histogram over `bounds` (seconds), its buckets cumulative.
    pub(crate) fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        let f = self.family(name, Kind::Histogram, help);
        for (b, n) in h.bounds.iter().zip(&h.counts) {
            let _ = writeln!(f.out, "{name}_bucket{{le=\"{b}\"}} {n}");
        }
        let _ = writeln!(f.out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(f.out, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
    }
}

/// The samples of one family.
pub(crate) struct Family<'a> {
    out: &'a mut String,
    name: String,
}

impl Family<'_> {
    /// The family's one sample, without labels.
    pub(crate) fn value(&mut self, v: impl Display) {
        let _ = writeln!(self.out, "{} {v}", self.name);
    }

    /// A sample with labels (their values escaped: etcd endpoints and
    /// peer names come from outside).
    pub(crate) fn sample(&mut self, labels: &[(&str, &dyn Display)], v: impl Display) {
        let _ = write!(self.out, "{}{{", self.name);
        for (i, (k, l)) in labels.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(self.out, "{sep}{k}=\"{}\"", escape(&l.to_string()));
        }
        let _ = writeln!(self.out, "}} {v}");
    }
}

/// A label value as the text format wants it: backslash, double quote and
/// newline escaped.
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Observations counted into fixed buckets (upper bounds, in seconds),
/// as Prometheus histograms are: each bucket counts what is at most its
/// bound.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub(crate) fn observe(&mut self, v: f64) {
        for (b, n) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *n += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_buckets_are_cumulative() {
        let mut e = Exposition::default();
        e.family("x", Kind::Gauge, "An x.")
            .sample(&[("a", &"q\"\\\n"), ("b", &7)], 1);
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        e.histogram("h", "An h.", &h);
        assert_eq!(
            e.into_string(),
            "# HELP x An x.\n# TYPE x gauge\nx{a=\"q\\\"\\\\\\n\",b=\"7\"} 1\n\
             # HELP h An h.\n# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"1\"} 2\n\
             h_bucket{le=\"+Inf\"} 3\nh_sum 5.55\nh_count 3\n"
        );
    }
}
