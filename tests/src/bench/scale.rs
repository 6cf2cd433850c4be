//! `cargo xtask bench scale [--nodes N] [--quiet-seconds S]
//! [--outage-seconds S] [--direct-only | --proxy-only] [--json FILE]`
//!
//! N real agents (one `weft agent --datapath none` process each: the real
//! lease code) on a real 3-member etcd, then the same through etcd's gRPC
//! proxy, through what a large cluster's control plane meets. Per phase:
//! - join storm: every agent started within a second or two; the time
//!   until N distinct subnets, etcd requests per join;
//! - steady state (S seconds, 300 by default): etcd messages received and
//!   sent per agent per second, etcd's CPU and memory, the agents' RSS and
//!   CPU;
//! - propagation: a new lease's time to reach every agent (p50, p99, max;
//!   each agent's peer count polled, so the resolution is one poll of all
//!   agents, a few hundred ms at 1,000);
//! - an etcd leader killed, every member restarted, every member down for
//!   an outage: full lists per agent, how the reconnections spread (from
//!   each agent's "lease watch reconnected" line), the time until every
//!   agent sees a lease put when etcd is back;
//! - a compaction past the agents' revision while they are cut off: full
//!   lists per agent (one each is right), and the time until every agent
//!   sees the lease put meanwhile.
//!
//! Goals (issue 58): join of 1,000 within 30 s, no two alike; at most 0.02
//! messages per agent per second each way in steady state; no full list
//! after a leader change, a restart or an outage that compacted nothing;
//! reconnections spread over at least 5 s at 1,000 agents; a new lease in
//! every agent within 2 s (p99) in steady state and within 30 s of etcd's
//! return; agent RSS under 20 MiB.

use std::{
    collections::HashSet,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{
    cluster::{Node, Underlay},
    etcd_cluster::{EtcdCluster, Options},
    etcd_fill::{messages, served_at},
    etcd_proxy::EtcdProxy,
    netns::Netns,
    swarm::{Swarm, cpu_seconds, log_time, quantiles},
    weft_cluster::PREFIX,
};

const CONFIG: &str = r#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
const WAIT: Duration = Duration::from_secs(600);

pub async fn run(args: &[String]) -> Result<()> {
    let args = args.to_vec();
    tokio::task::block_in_place(move || run_blocking(&args))
}

fn run_blocking(args: &[String]) -> Result<()> {
    let n: usize = super::flag(args, "--nodes").unwrap_or(1000);
    let quiet = Duration::from_secs(super::flag(args, "--quiet-seconds").unwrap_or(300));
    let outage = Duration::from_secs(super::flag(args, "--outage-seconds").unwrap_or(60));
    let json_out: Option<String> = super::flag(args, "--json");
    let mut modes = vec![];
    if !args.iter().any(|a| a == "--proxy-only") {
        modes.push(false);
    }
    if !args.iter().any(|a| a == "--direct-only") {
        modes.push(true);
    }
    let mut results = vec![];
    for proxy in modes {
        let r = Run::new(n, proxy)?.measure(quiet, outage)?;
        println!("{}", serde_json::to_string_pretty(&r)?);
        results.push(r);
    }
    if let Some(f) = json_out {
        std::fs::write(&f, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {f}"))?;
    }
    Ok(())
}

struct Run {
    n: usize,
    proxy: Option<EtcdProxy>,
    ec: EtcdCluster,
    node: Node,
    swarm: Option<Swarm>,
    /// Kept for the run: everything above lives on it.
    _underlay: Underlay,
    /// Leases the bench put (beyond the agents').
    extra: u32,
}

/// Seconds of the day (UTC) now, as the agents' log lines have them.
fn now_of_day() -> f64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_secs_f64() % 86_400.0
}

impl Run {
    fn new(n: usize, proxy: bool) -> Result<Self> {
        let underlay = Underlay::new()?;
        let ec = EtcdCluster::start(&underlay, 3, Options::default())?;
        ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])?;
        let proxy = if proxy {
            Some(EtcdProxy::start(
                &underlay,
                "198.18.0.250",
                &ec.endpoints(),
            )?)
        } else {
            None
        };
        let node = Node::new(&underlay, 1)?;
        Ok(Self {
            n,
            proxy,
            ec,
            node,
            swarm: None,
            _underlay: underlay,
            extra: 0,
        })
    }

    fn ns(&self) -> &Netns {
        &self.node.ns
    }

    fn swarm(&self) -> &Swarm {
        self.swarm.as_ref().expect("started")
    }

    /// Requests every member began (unary and streams), summed.
    fn requests(&self) -> f64 {
        self.ec
            .members
            .iter()
            .filter_map(|m| {
                let ip = m.ip.parse().ok()?;
                [
                    "Range",
                    "Txn",
                    "Put",
                    "DeleteRange",
                    "LeaseGrant",
                    "LeaseKeepAlive",
                    "Watch",
                    "Status",
                    "LeaseTimeToLive",
                ]
                .iter()
                .map(|method| served_at(&m.ns, ip, method).ok())
                .sum::<Option<f64>>()
            })
            .sum()
    }

    /// Messages every member received and sent, summed.
    fn messages(&self) -> (f64, f64) {
        self.ec
            .members
            .iter()
            .filter_map(|m| messages(&m.ns, m.ip.parse().ok()?).ok())
            .fold((0.0, 0.0), |(r, s), (r2, s2)| (r + r2, s + s2))
    }

    /// The members' CPU seconds and resident memory (MiB), summed.
    fn etcd_usage(&self) -> (f64, f64) {
        let mut cpu = 0.0;
        let mut rss = 0.0;
        for i in 0..self.ec.members.len() {
            // `ip netns exec` execs etcd: the child's pid is etcd's.
            let pid = self.ec.pid(i);
            cpu += cpu_seconds(pid);
            rss += rss_mib(pid);
        }
        (cpu, rss)
    }

    /// Every agent's `weft_watch_lists_total`, summed.
    fn lists(&self) -> f64 {
        self.swarm().metric_sum(self.ns(), "weft_watch_lists_total")
    }

    /// Puts one more lease of a node outside the swarm (retried while etcd
    /// elects a leader); the peers every agent must then have.
    fn put_lease(&mut self) -> usize {
        let i = self.extra;
        self.extra += 1;
        let k = 60_000 + i;
        let key = format!("{PREFIX}/subnets/10.{}.{}.0-24", k >> 8, k & 0xff);
        let value = format!(
            r#"{{"PublicIP":"192.168.{}.{}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:{:02x}:{:02x}"}}}}"#,
            100 + (i >> 8),
            1 + (i & 0xff),
            i >> 8,
            i & 0xff
        );
        let t = Instant::now();
        while self.ec.etcdctl(&["put", &key, &value]).is_err() && t.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.n - 1 + self.extra as usize
    }

    /// Polls every agent until each has `peers` peers; when each got there
    /// (from `t0`), in seconds.
    fn until_peers(&self, peers: usize, t0: Instant) -> Result<Vec<f64>> {
        let mut at: Vec<Option<f64>> = vec![None; self.n];
        while at.iter().any(Option::is_none) {
            if t0.elapsed() > WAIT {
                let missing = at.iter().filter(|a| a.is_none()).count();
                bail!("{missing} agents did not reach {peers} peers within {WAIT:?}");
            }
            let now = t0.elapsed().as_secs_f64();
            for (i, p) in self
                .swarm()
                .metric(self.ns(), "weft_peers")
                .into_iter()
                .enumerate()
            {
                if at[i].is_none() && p == Some(peers as f64) {
                    at[i] = Some(now);
                }
            }
        }
        Ok(at.into_iter().flatten().collect())
    }

    /// How the agents' watches reconnected after `since` (seconds of the
    /// day): their spread (p10 to p90, and first to last), in seconds.
    fn reconnections(&self, since: f64) -> Value {
        let mut times: Vec<f64> = self
            .swarm()
            .agents
            .iter()
            .filter_map(|a| {
                a.log()
                    .lines()
                    .filter(|l| l.contains("lease watch reconnected"))
                    .filter_map(log_time)
                    .find(|t| *t >= since)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        if times.is_empty() {
            return json!({"reconnected": 0});
        }
        let q = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        json!({
            "reconnected": times.len(),
            "first_s": times[0] - since,
            "p10_to_p90_s": q(0.9) - q(0.1),
            "first_to_last_s": times[times.len() - 1] - times[0],
        })
    }

    fn measure(mut self, quiet: Duration, outage: Duration) -> Result<Value> {
        let n = self.n;
        let mut out = json!({
            "agents": n,
            "etcd": if self.proxy.is_some() { "3 members behind etcd grpc-proxy" } else { "3 members" },
        });
        let endpoint = match &self.proxy {
            Some(p) => p.endpoint(),
            None => self.ec.endpoints(),
        };

        // The join storm.
        let req0 = self.requests();
        let t0 = Instant::now();
        let swarm = Swarm::start(self.ns(), self.node.ip, n, &endpoint, 20_000, &[])?;
        let spawned = t0.elapsed();
        self.swarm = Some(swarm);
        let subnets = loop {
            let s = self.swarm().subnets();
            if s.iter().all(Option::is_some) {
                break s;
            }
            if t0.elapsed() > WAIT {
                bail!("not every agent took a subnet within {WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let joined = t0.elapsed();
        let distinct: HashSet<String> = subnets.into_iter().flatten().collect();
        let converged = self.until_peers(n - 1, t0)?;
        let (_, _, all_converged) = quantiles(&mut converged.clone());
        out["join"] = json!({
            "spawned_s": spawned.as_secs_f64(),
            "distinct_subnets_s": joined.as_secs_f64(),
            "distinct": distinct.len(),
            "every_agent_every_peer_s": all_converged,
            "etcd_requests_per_join": (self.requests() - req0) / n as f64,
        });
        println!("join: {}", out["join"]);

        // Steady state.
        std::thread::sleep(Duration::from_secs(15));
        let (r0, s0) = self.messages();
        let (ecpu0, _) = self.etcd_usage();
        let acpu0 = self.swarm().cpu_seconds();
        std::thread::sleep(quiet);
        let (r1, s1) = self.messages();
        let (ecpu1, erss) = self.etcd_usage();
        let acpu1 = self.swarm().cpu_seconds();
        let per = |d: f64| d / quiet.as_secs_f64() / n as f64;
        let mut rss: Vec<f64> = self
            .swarm()
            .rss()
            .into_iter()
            .map(|b| b as f64 / (1 << 20) as f64)
            .collect();
        let (rss50, _, rssmax) = quantiles(&mut rss);
        out["steady"] = json!({
            "seconds": quiet.as_secs(),
            "etcd_received_per_agent_s": per(r1 - r0),
            "etcd_sent_per_agent_s": per(s1 - s0),
            "etcd_cpu_percent_of_a_core": (ecpu1 - ecpu0) / quiet.as_secs_f64() * 100.0,
            "etcd_rss_mib_all_members": erss,
            "agents_cpu_percent_of_a_core_all": (acpu1 - acpu0) / quiet.as_secs_f64() * 100.0,
            "agent_rss_mib_p50": rss50,
            "agent_rss_mib_max": rssmax,
        });
        println!("steady: {}", out["steady"]);

        // Propagation of a new lease, five times.
        let mut lat = vec![];
        for _ in 0..5 {
            let t = Instant::now();
            let peers = self.put_lease();
            lat.extend(self.until_peers(peers, t)?);
        }
        let (p50, p99, max) = quantiles(&mut lat);
        out["propagation"] = json!({"p50_s": p50, "p99_s": p99, "max_s": max});
        println!("propagation: {}", out["propagation"]);

        // The leader killed.
        let lists0 = self.lists();
        let leader = self.ec.leader()?;
        let since = now_of_day();
        let t = Instant::now();
        self.ec.kill(leader);
        let peers = self.put_lease();
        let mut seen = self.until_peers(peers, t)?;
        self.ec.restart(leader, None)?;
        let (_, p99, max) = quantiles(&mut seen);
        out["leader_killed"] = json!({
            "full_lists_per_agent": (self.lists() - lists0) / n as f64,
            "reconnections": self.reconnections(since),
            "new_lease_p99_s": p99,
            "new_lease_max_s": max,
        });
        println!("leader killed: {}", out["leader_killed"]);
        std::thread::sleep(Duration::from_secs(10));

        // Every member restarted, then every member down for the outage.
        for (name, down) in [("etcd_restarted", Duration::ZERO), ("etcd_outage", outage)] {
            let lists0 = self.lists();
            for i in 0..3 {
                self.ec.kill(i);
            }
            std::thread::sleep(down.max(Duration::from_secs(1)));
            let back = now_of_day();
            let t = Instant::now();
            for i in 0..3 {
                self.ec.restart(i, None)?;
            }
            let peers = self.put_lease();
            let mut seen = self.until_peers(peers, t)?;
            let (_, p99, max) = quantiles(&mut seen);
            out[name] = json!({
                "down_s": down.as_secs(),
                "full_lists_per_agent": (self.lists() - lists0) / n as f64,
                "reconnections": self.reconnections(back),
                "new_lease_since_return_p99_s": p99,
                "new_lease_since_return_max_s": max,
            });
            println!("{name}: {}", out[name]);
            std::thread::sleep(Duration::from_secs(10));
        }

        // A compaction past the agents' revision, while they are cut off.
        let lists0 = self.lists();
        let resumes0 = self
            .swarm()
            .metric_sum(self.ns(), "weft_watch_resumes_total");
        self.ns().cut_tcp_out(2379)?;
        let t = Instant::now();
        while self
            .swarm()
            .metric_sum(self.ns(), "weft_watch_resumes_total")
            < resumes0 + n as f64
        {
            if t.elapsed() > WAIT {
                bail!("the watches did not break while cut off");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let peers = self.put_lease();
        self.ec.etcdctl(&["put", "/weft-bench/bump", "1"])?;
        let rev = self.ec.etcdctl(&["get", "x", "-w", "json"])?;
        let rev = serde_json::from_str::<Value>(&rev)?["header"]["revision"]
            .as_i64()
            .context("a revision")?;
        self.ec.etcdctl(&["compact", &rev.to_string()])?;
        let back = now_of_day();
        let t = Instant::now();
        self.ns().uncut()?;
        let mut seen = self.until_peers(peers, t)?;
        let (_, p99, max) = quantiles(&mut seen);
        out["compacted_while_cut_off"] = json!({
            "full_lists_per_agent": (self.lists() - lists0) / n as f64,
            "reconnections": self.reconnections(back),
            "new_lease_p99_s": p99,
            "new_lease_max_s": max,
        });
        println!("compacted: {}", out["compacted_while_cut_off"]);

        if let Some(s) = &mut self.swarm {
            s.stop();
        }
        Ok(out)
    }
}

fn rss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
