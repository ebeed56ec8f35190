//! Building Prometheus metric families by hand (for collectors whose values come from a sample
//! rather than from live counters), encoded by the `prometheus` crate's text encoder.

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A family under construction.
pub struct Family(MetricFamily);

impl Family {
    pub fn counter(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::COUNTER)
    }

    pub fn gauge(name: &str, help: &str) -> Self {
        Self::new(name, help, MetricType::GAUGE)
    }

    fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Self(f)
    }

    /// Adds one sample; `timestamp_ms` is written after the value when given (0 = none).
    /// Labels are sorted by name, as the registry's gather does.
    pub fn push(&mut self, labels: &[(&str, &str)], value: f64, timestamp_ms: i64) -> &mut Self {
        let mut sorted = labels.to_vec();
        sorted.sort_by_key(|(k, _)| *k);
        let mut m = Metric::from_label(
            sorted
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name((*k).to_string());
                    l.set_value((*v).to_string());
                    l
                })
                .collect(),
        );
        if self.0.get_field_type() == MetricType::COUNTER {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        if timestamp_ms != 0 {
            m.set_timestamp_ms(timestamp_ms);
        }
        self.0.mut_metric().push(m);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.get_metric().is_empty()
    }

    pub fn build(self) -> MetricFamily {
        self.0
    }
}

/// The text exposition (format 0.0.4) of `families`, in the order given.
pub fn encode(families: &[MetricFamily]) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(families, &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_with_timestamps() {
        let mut c = Family::counter("x_total", "X.");
        c.push(&[("pod", "a")], 1.5, 1_700_000_000_123);
        let mut g = Family::gauge("y_bytes", "Y.");
        g.push(&[], 42.0, 0);
        let text = encode(&[c.build(), g.build()]);
        assert!(text.contains("# TYPE x_total counter\n"), "{text}");
        assert!(text.contains("x_total{pod=\"a\"} 1.5 1700000000123\n"), "{text}");
        assert!(text.contains("# TYPE y_bytes gauge\ny_bytes 42\n"), "{text}");
    }
}
