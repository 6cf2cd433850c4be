//! etcd with mutual TLS and auth, as operators run it: agents started before
//! etcd wait for it; they authenticate as a user holding only the node role
//! the README documents; an expired token is refreshed; wrong CA, wrong
//! client certificate and wrong password each give an error naming the
//! problem (retried where it may pass, fatal where it cannot); https://
//! without a CA file uses the system's CAs; SIGHUP reads the certificate
//! files again.

use std::time::Duration;

use weft_tests::{
    agent::{Agent, eventually},
    cluster::Node,
    etcd_cluster::{EtcdCluster, Options, Pki},
    weft_cluster::{CONFIG, PREFIX, WeftCluster},
};

const T: Duration = Duration::from_secs(30);

/// An agent on `node` (control plane only) with these etcd flags.
fn agent(node: &Node, name: &str, etcd: &[String]) -> Agent {
    let mut args: Vec<String> = etcd.to_vec();
    args.extend(
        [
            "--node-id",
            name,
            "--datapath",
            "none",
            "--public-ip",
            &node.ip.to_string(),
            "--healthz-port",
            "9090",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    Agent::start(name, Some(&node.ns), &args).unwrap()
}

/// One series of the /metrics of the agent on `node` (None while it is
/// not served).
fn metric(node: &Node, series: &str) -> Option<f64> {
    weft_tests::weft_cluster::http_get(&node.ns, node.ip, 9090, "/metrics")
        .ok()
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
}

/// The peers an agent has programmed (its /metrics).
fn peers(node: &Node) -> f64 {
    metric(node, "weft_peers").unwrap_or(-1.0)
}

/// Waits until the series satisfies `ok`.
fn wait_metric(node: &Node, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    eventually(&format!("{series} on {}", node.ip), T, || {
        metric(node, series).filter(|v| ok(*v))
    })
}

const FAILED: &str = "weft_etcd_reconnects_total{result=\"failed\"}";
const RECONNECTED: &str = "weft_etcd_reconnects_total{result=\"ok\"}";

fn tls_flags(pki: &Pki, endpoints: &str, cert: &str, ca: &str) -> Vec<String> {
    vec![
        "--etcd-endpoints".into(),
        endpoints.into(),
        "--etcd-cafile".into(),
        pki.path(&format!("{ca}.pem")).display().to_string(),
        "--etcd-certfile".into(),
        pki.path(&format!("{cert}.pem")).display().to_string(),
        "--etcd-keyfile".into(),
        pki.path(&format!("{cert}.key")).display().to_string(),
    ]
}

fn with_user(mut flags: Vec<String>, password: &str) -> Vec<String> {
    flags.extend([
        "--etcd-username".into(),
        "node".into(),
        "--etcd-password".into(),
        password.into(),
    ]);
    flags
}

#[test]
fn mutual_tls_with_auth_and_the_node_role() {
    let c = WeftCluster::new(0, &[]).unwrap();
    let pki = Pki::new(3).unwrap();
    let endpoints = (0..3)
        .map(|i| format!("https://{}:2379", weft_tests::etcd_cluster::member_ip(i)))
        .collect::<Vec<_>>()
        .join(",");
    let good = with_user(tls_flags(&pki, &endpoints, "client", "ca"), "nodepw");

    // Started before etcd exists: it waits.
    let n1 = Node::new(&c.underlay, 1).unwrap();
    let a1 = agent(&n1, "node-1", &good);
    wait_metric(&n1, "weft_etcd_errors_total", |n| n >= 1.0);
    assert!(a1.running());

    // etcd comes: 3 members, mutual TLS, auth on with tokens that expire
    // after 2 s idle, the node role only.
    let mut ec = EtcdCluster::start(
        &c.underlay,
        3,
        Options {
            pki: Some(&pki),
            auth_token_ttl: Some(2),
        },
    )
    .unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    ec.enable_auth(PREFIX).unwrap();
    let s1 = a1.wait_subnet(T).unwrap();
    let n2 = Node::new(&c.underlay, 2).unwrap();
    let a2 = agent(&n2, "node-2", &good);
    let s2 = a2.wait_subnet(T).unwrap();
    assert_ne!(s1, s2);

    // Idle past the token's life, then cut off from etcd while a third
    // node joins: back, node 1's watch starts again from a list, a request
    // its expired token no longer opens, so the token is renewed.
    eventually("node 1 sees node 2", T, || {
        (peers(&n1) == 1.0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    n1.ns.cut_tcp_out(2379).unwrap();
    let n3 = Node::new(&c.underlay, 3).unwrap();
    let a3 = agent(&n3, "node-3", &good);
    a3.wait_subnet(T).unwrap();
    eventually("node 2 sees node 3", T, || {
        (peers(&n2) == 2.0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    n1.ns.uncut().unwrap();
    eventually("node 1 sees node 3 after its token expired", T, || {
        (peers(&n1) == 2.0).then_some(())
    });

    // Wrong CA: a clear error, retried (the file may be fixed).
    let n4 = Node::new(&c.underlay, 4).unwrap();
    let bad_ca = agent(
        &n4,
        "node-4",
        &with_user(tls_flags(&pki, &endpoints, "client", "other-ca"), "nodepw"),
    );
    wait_metric(&n4, "weft_etcd_errors_total", |n| n >= 1.0);
    std::thread::sleep(Duration::from_secs(2));
    assert!(bad_ca.running(), "a wrong CA is retried");
    assert!(
        bad_ca.log().to_lowercase().contains("certificate"),
        "the error names the certificate: {}",
        bad_ca.log()
    );
    drop(bad_ca);

    // A client certificate from another CA: refused by etcd, retried.
    let rogue = agent(
        &n4,
        "node-4",
        &with_user(tls_flags(&pki, &endpoints, "rogue", "ca"), "nodepw"),
    );
    wait_metric(&n4, "weft_etcd_errors_total", |n| n >= 1.0);
    std::thread::sleep(Duration::from_secs(2));
    assert!(rogue.running(), "a refused certificate is retried");
    drop(rogue);

    // A wrong password: fatal, with a message that says so.
    let wrong = agent(
        &n4,
        "node-4",
        &with_user(tls_flags(&pki, &endpoints, "client", "ca"), "nope"),
    );
    eventually("the agent with a wrong password exits", T, || {
        (!wrong.running()).then_some(())
    });
    assert!(
        wrong
            .log()
            .contains("etcd refused --etcd-username/--etcd-password"),
        "{}",
        wrong.log()
    );

    // TLS flags with http:// endpoints: refused at start.
    let (ok, _, err) = weft_tests::agent::weft(&[
        "agent",
        "--etcd-endpoints",
        "http://127.0.0.1:2379",
        "--etcd-keyfile",
        "/nonexistent",
        "--etcd-certfile",
        "/nonexistent",
        "--datapath",
        "none",
        "--public-ip",
        "198.18.0.9",
    ]);
    assert!(!ok && err.contains("use https:// endpoints"), "{err}");

    // SIGHUP: the certificate files are read again. A rogue certificate in
    // place keeps the current connection; the right one reconnects.
    let client_pem = pki.path("client.pem");
    let saved = std::fs::read(&client_pem).unwrap();
    std::fs::copy(pki.path("rogue.pem"), &client_pem).unwrap();
    let saved_key = std::fs::read(pki.path("client.key")).unwrap();
    std::fs::copy(pki.path("rogue.key"), pki.path("client.key")).unwrap();
    let made = metric(&n1, RECONNECTED).unwrap();
    a1.signal(libc::SIGHUP);
    wait_metric(&n1, FAILED, |n| n >= 1.0);
    assert_eq!(metric(&n1, RECONNECTED), Some(made));
    std::fs::write(&client_pem, saved).unwrap();
    std::fs::write(pki.path("client.key"), saved_key).unwrap();
    // The files are as the connection read them: only the signal makes
    // the agent connect again.
    a1.signal(libc::SIGHUP);
    wait_metric(&n1, RECONNECTED, |n| n == made + 1.0);
    assert!(a1.running());
    drop(ec);
}

/// A Kubernetes Secret volume's update: the files are links through
/// `..data`, which the kubelet swaps to a new directory. The agent notices
/// the new contents by itself (no SIGHUP) and connects with them: a rogue
/// certificate swapped in is tried and refused (the current connection
/// stays), a renewed one swapped in after it is used.
#[test]
fn a_secret_volumes_swapped_files_are_used_without_a_signal() {
    let c = WeftCluster::new(0, &[]).unwrap();
    let pki = Pki::new(1).unwrap();
    let ec = EtcdCluster::start(
        &c.underlay,
        1,
        Options {
            pki: Some(&pki),
            auth_token_ttl: None,
        },
    )
    .unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    // The volume as the kubelet lays it out.
    let vol = pki.path("secret-volume");
    let version = |name: &str, cert: &str| {
        let d = vol.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(pki.path("ca.pem"), d.join("ca.crt")).unwrap();
        std::fs::copy(pki.path(&format!("{cert}.pem")), d.join("tls.crt")).unwrap();
        std::fs::copy(pki.path(&format!("{cert}.key")), d.join("tls.key")).unwrap();
    };
    let point = |name: &str| {
        let tmp = vol.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, vol.join("..data")).unwrap();
    };
    version("..2026_12_01_a", "client");
    point("..2026_12_01_a");
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), vol.join(f)).unwrap();
    }
    let flags: Vec<String> = [
        "--etcd-endpoints",
        &ec.endpoints(),
        "--etcd-cafile",
        &vol.join("ca.crt").display().to_string(),
        "--etcd-certfile",
        &vol.join("tls.crt").display().to_string(),
        "--etcd-keyfile",
        &vol.join("tls.key").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let n1 = Node::new(&c.underlay, 1).unwrap();
    let a = agent(&n1, "node-1", &flags);
    a.wait_subnet(T).unwrap();
    // A rogue certificate swapped in: tried, refused, the connection kept.
    version("..2026_12_01_b", "rogue");
    point("..2026_12_01_b");
    wait_metric(&n1, FAILED, |n| n >= 1.0);
    assert_eq!(metric(&n1, RECONNECTED), Some(0.0), "the connection kept");
    // The renewed certificate swapped in: used.
    version("..2026_12_01_c", "client2");
    point("..2026_12_01_c");
    wait_metric(&n1, RECONNECTED, |n| n == 1.0);
    assert!(a.running());
    // And the connection works: a second node's lease reaches this one.
    let n2 = Node::new(&c.underlay, 2).unwrap();
    let mut f2 = tls_flags(&pki, &ec.endpoints(), "client", "ca");
    f2.truncate(8);
    let b = agent(&n2, "node-2", &f2);
    b.wait_subnet(T).unwrap();
    eventually("node 1 sees node 2 over the renewed connection", T, || {
        (peers(&n1) == 1.0).then_some(())
    });
}

/// https:// without `--etcd-cafile`: the system's CAs (`SSL_CERT_FILE`
/// stands in for the system bundle here).
#[test]
fn https_without_a_ca_file_uses_the_system_cas() {
    let c = WeftCluster::new(0, &[]).unwrap();
    let pki = Pki::new(1).unwrap();
    let ec = EtcdCluster::start(
        &c.underlay,
        1,
        Options {
            pki: Some(&pki),
            auth_token_ttl: None,
        },
    )
    .unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    let mut flags = tls_flags(&pki, &ec.endpoints(), "client", "ca");
    flags.drain(2..4); // no --etcd-cafile
    let n1 = Node::new(&c.underlay, 1).unwrap();
    // The test CA is not among this machine's CAs: refused, said, retried.
    let a = agent(&n1, "node-1", &flags);
    a.wait_log("invalid peer certificate: UnknownIssuer", T)
        .unwrap();
    // Retried.
    wait_metric(&n1, "weft_etcd_errors_total", |n| n >= 2.0);
    drop(a);
    // With the test CA as the system bundle: trusted.
    let mut args = flags.clone();
    args.extend(
        [
            "--node-id",
            "node-1",
            "--datapath",
            "none",
            "--public-ip",
            "198.18.0.1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let ca = pki.path("ca.pem").display().to_string();
    let a =
        Agent::start_with_env("node-1", Some(&n1.ns), &args, &[("SSL_CERT_FILE", &ca)]).unwrap();
    a.wait_subnet(T).unwrap();
}
