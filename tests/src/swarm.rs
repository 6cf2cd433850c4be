//! Many real agents on one etcd: `weft agent --datapath none` (the real
//! lease code, no dataplane), one process each, all in one network
//! namespace with a health port each, as the control plane of a large
//! cluster sees them. For the control plane's scale test and
//! `cargo xtask bench scale`.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{agent::Agent, netns::Netns, weft_cluster::http_get};

/// The agents; what asks them is given the namespace they run in.
pub struct Swarm {
    pub agents: Vec<Agent>,
    /// The address their health ports listen on, the first port.
    ip: Ipv4Addr,
    first_port: u16,
}

/// The public IP agent `i` claims (198.19.0.0/16, never on a wire).
pub fn public_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xc613_0000u32 + 1 + i as u32)
}

/// One agent's answer to a GET (status line, body), None if it gave none.
type Answer = Option<(String, String)>;

impl Swarm {
    /// Starts `n` agents in `ns` (which has `ip`), given `endpoints`, all at
    /// once; health ports from `first_port` on.
    pub fn start(
        ns: &Netns,
        ip: Ipv4Addr,
        n: usize,
        endpoints: &str,
        first_port: u16,
        extra: &[&str],
    ) -> Result<Self> {
        // Started from a few threads at once: a thousand agents within a
        // second or two, as a cluster's nodes boot.
        let args_of = |i: usize| -> Vec<String> {
            let port = first_port + i as u16;
            let mut args: Vec<String> = [
                "--etcd-endpoints",
                endpoints,
                "--node-id",
                &format!("swarm-{i}"),
                "--datapath",
                "none",
                "--public-ip",
                &public_ip(i).to_string(),
                "--healthz-ip",
                &ip.to_string(),
                "--healthz-port",
                &port.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        };
        let threads = 4.min(n.max(1));
        let started: Vec<Result<Vec<(usize, Agent)>>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let args_of = &args_of;
                    sc.spawn(move || {
                        (t..n)
                            .step_by(threads)
                            .map(|i| {
                                Agent::start_with_env(
                                    &format!("swarm-{i}"),
                                    Some(ns),
                                    &args_of(i),
                                    &[("WEFT_LOG", "info")],
                                )
                                .map(|a| (i, a))
                                .with_context(|| format!("starting agent {i}"))
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a starter thread"))
                .collect()
        });
        let mut agents: Vec<(usize, Agent)> = Vec::with_capacity(n);
        for part in started {
            agents.extend(part?);
        }
        agents.sort_by_key(|(i, _)| *i);
        let agents = agents.into_iter().map(|(_, a)| a).collect();
        Ok(Self {
            agents,
            ip,
            first_port,
        })
    }

    /// One GET to every agent (in `ns`): each answer (None where an agent
    /// did not answer).
    fn get_all(&self, ns: &Netns, path: &str) -> Vec<Answer> {
        let n = self.agents.len();
        let threads = 8.min(n.max(1));
        let mut out = vec![None; n];
        let parts: Vec<Vec<(usize, Answer)>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    sc.spawn(move || {
                        (t..n)
                            .step_by(threads)
                            .map(|i| {
                                (
                                    i,
                                    http_get(ns, self.ip, self.first_port + i as u16, path).ok(),
                                )
                            })
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a getter thread"))
                .collect()
        });
        for (i, r) in parts.into_iter().flatten() {
            out[i] = r;
        }
        out
    }

    /// Every agent's value of one metric series (None where it has none).
    pub fn metric(&self, ns: &Netns, series: &str) -> Vec<Option<f64>> {
        self.get_all(ns, "/metrics")
            .into_iter()
            .map(|r| {
                let (_, body) = r?;
                body.lines()
                    .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            })
            .collect()
    }

    /// The sum of one metric over every agent (those that answer).
    pub fn metric_sum(&self, ns: &Netns, series: &str) -> f64 {
        self.metric(ns, series).into_iter().flatten().sum()
    }

    /// Which agents answer `/readyz` with 200.
    pub fn ready(&self, ns: &Netns) -> Vec<bool> {
        self.get_all(ns, "/readyz")
            .into_iter()
            .map(|r| r.is_some_and(|(status, _)| status == "HTTP/1.1 200 OK"))
            .collect()
    }

    /// Polls every agent's readiness every `every` until all are ready or
    /// `within` passes; for each agent, when it was first seen ready (from
    /// the start of the call).
    pub fn ready_times(
        &self,
        ns: &Netns,
        every: Duration,
        within: Duration,
    ) -> Vec<Option<Duration>> {
        let start = Instant::now();
        let mut at = vec![None; self.agents.len()];
        while start.elapsed() < within && at.iter().any(Option::is_none) {
            for (i, r) in self.ready(ns).into_iter().enumerate() {
                if r && at[i].is_none() {
                    at[i] = Some(start.elapsed());
                }
            }
            std::thread::sleep(every);
        }
        at
    }

    /// Every agent's subnet (FLANNEL_SUBNET), where it wrote one.
    pub fn subnets(&self) -> Vec<Option<String>> {
        self.agents.iter().map(Agent::subnet).collect()
    }

    /// Stops every agent (SIGTERM, as a rollout does), all at once.
    pub fn stop(&mut self) {
        for a in &self.agents {
            a.signal(libc::SIGTERM);
        }
        for a in &mut self.agents {
            let _ = a.stop();
        }
    }

    /// Resident memory of every running agent, in bytes.
    pub fn rss(&self) -> Vec<u64> {
        self.agents
            .iter()
            .filter_map(|a| {
                let s = std::fs::read_to_string(format!("/proc/{}/status", a.pid())).ok()?;
                let kb: u64 = s
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))?
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse()
                    .ok()?;
                Some(kb << 10)
            })
            .collect()
    }

    /// CPU seconds (user and system) every agent has used, summed.
    pub fn cpu_seconds(&self) -> f64 {
        self.agents.iter().map(|a| cpu_seconds(a.pid())).sum()
    }
}

/// CPU time (user and system, in seconds) process `pid` has used (0 when
/// it is gone).
pub fn cpu_seconds(pid: i32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, after)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime, fields 14 and 15 of proc(5) (counted here from the
    // state, field 3), in clock ticks of 100 Hz.
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// Quantiles of `xs` (sorted in place): p50, p99 and max.
pub fn quantiles(xs: &mut [f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    xs.sort_by(f64::total_cmp);
    let q = |p: f64| xs[((xs.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.99), xs[xs.len() - 1])
}

/// Seconds of the day (UTC) of a log line's timestamp
/// (`...T20:04:07.033369Z`), as the agents write them.
pub fn log_time(line: &str) -> Option<f64> {
    let t = line.split_once('T')?.1.split_once('Z')?.0;
    let mut parts = t.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}
