//! `cargo xtask bench <datapath|egress|leases|control-plane|scale> [options]`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(which) = args.first().cloned() else {
        eprintln!(
            "usage: weft-bench <datapath|egress|leases|control-plane|scale> [--json FILE] [options]"
        );
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let rest = &args[1..];
    let r = rt.block_on(async {
        match which.as_str() {
            "leases" => weft_tests::bench::leases::run(rest).await,
            "datapath" => weft_tests::bench::datapath::run(rest).await,
            "egress" => weft_tests::bench::egress::run(rest).await,
            "control-plane" => weft_tests::bench::control_plane::run(rest).await,
            "scale" => weft_tests::bench::scale::run(rest).await,
            other => Err(anyhow::anyhow!(
                "unknown benchmark {other:?}: datapath, egress, leases, control-plane or scale"
            )),
        }
    });
    if let Err(e) = r {
        eprintln!("weft-bench: {e:#}");
        std::process::exit(1);
    }
}
