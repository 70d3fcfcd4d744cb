//! Quick manual check: `cargo run --release -p agentrl-sandbox --example latency -- [N] [CMD...]`.
use agentrl_sandbox::{RunRequest, Sandbox, SandboxConfig};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = if !args.is_empty() && args[0].parse::<usize>().is_ok() {
        args.remove(0).parse().unwrap()
    } else {
        200
    };
    if args.is_empty() {
        args.push("/bin/true".into());
    }
    let sb = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let argv: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
    let r = sb
        .run(RunRequest {
            argv: argv.clone(),
            ..Default::default()
        })
        .expect("run");
    println!("{r:?}");
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let r = sb
            .run(RunRequest {
                argv: argv.clone(),
                ..Default::default()
            })
            .expect("run");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(r.ok(), "{r:?}");
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "median {:.3} ms, p90 {:.3} ms over {n} runs",
        times[n / 2],
        times[n * 9 / 10]
    );
    let threads = 8;
    let sb = std::sync::Arc::new(sb);
    let t = std::time::Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let sb = sb.clone();
            let argv = argv.clone();
            std::thread::spawn(move || {
                for _ in 0..n / threads {
                    let r = sb
                        .run(RunRequest {
                            argv: argv.clone(),
                            ..Default::default()
                        })
                        .expect("run");
                    assert!(r.ok(), "{r:?}");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let done = n / threads * threads;
    println!(
        "saturated ({threads} threads): {:.0} runs/s",
        done as f64 / t.elapsed().as_secs_f64()
    );
}
