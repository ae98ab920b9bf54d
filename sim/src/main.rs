//! `vigil-sim`: runs seeds of the deterministic simulation and prints each failing seed with
//! the command that replays it.
//!
//! ```text
//! vigil-sim --seeds 10000            # seeds 0..10000, on every core
//! vigil-sim --seeds 1000 --from 5000 # seeds 5000..6000
//! vigil-sim --seed 42 --trace        # one seed, with its trace
//! vigil-sim --seeds 100 --twice      # each seed twice: the traces must be equal
//! vigil-sim --plant stale-reads --seeds 200   # a planted bug (negative control)
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vigil_sim::{Config, Plant, run, run_catching};

struct Args {
    from: u64,
    count: u64,
    trace: bool,
    /// Run each seed twice and compare the traces' digests.
    twice: bool,
    plant: Plant,
    threads: usize,
}

fn usage() -> ExitCode {
    let plants: Vec<&str> = [Plant::None]
        .into_iter()
        .chain(Plant::ALL)
        .map(Plant::name)
        .collect();
    eprintln!(
        "usage: vigil-sim [--seeds N] [--from S] [--seed S] [--trace] [--twice] [--threads T] [--plant NAME]\n  NAME: {}",
        plants.join(", ")
    );
    ExitCode::from(2)
}

fn parse() -> Option<Args> {
    let mut args = Args {
        from: 0,
        count: 100,
        trace: false,
        twice: false,
        plant: Plant::None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seeds" => args.count = it.next()?.parse().ok()?,
            "--from" => args.from = it.next()?.parse().ok()?,
            "--seed" => {
                args.from = it.next()?.parse().ok()?;
                args.count = 1;
            }
            "--trace" => args.trace = true,
            "--twice" => args.twice = true,
            "--threads" => args.threads = it.next()?.parse().ok()?,
            "--plant" => args.plant = Plant::parse(&it.next()?)?,
            _ => return None,
        }
    }
    Some(args)
}

fn main() -> ExitCode {
    let Some(args) = parse() else {
        return usage();
    };
    let args = Arc::new(args);
    let next = Arc::new(AtomicU64::new(args.from));
    let failed = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..args.threads.max(1))
        .map(|_| {
            let (args, next, failed) = (Arc::clone(&args), Arc::clone(&next), Arc::clone(&failed));
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= args.from + args.count {
                        return;
                    }
                    let config = Config {
                        plant: args.plant,
                        ..Config::new(seed)
                    };
                    let report = run_catching(config);
                    if args.trace {
                        println!("{}", report.trace.join("\n"));
                    }
                    let mut violations = report.violations;
                    if args.twice {
                        let again = run(config);
                        if again.digest != report.digest {
                            violations.push(format!(
                                "the seed did not replay: trace digests {:016x} and {:016x}",
                                report.digest, again.digest
                            ));
                        }
                    }
                    if !violations.is_empty() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        let plant = match args.plant {
                            Plant::None => String::new(),
                            p => format!(" --plant {}", p.name()),
                        };
                        println!(
                            "seed {seed} FAILED: {}\n  replay: cargo run --release -p vigil-sim -- --seed {seed}{plant} --trace",
                            violations.join("\n  ")
                        );
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a simulation thread panicked");
    }
    let failed = failed.load(Ordering::Relaxed);
    println!(
        "{} seeds from {} ({}): {failed} failed in {:.1?}",
        args.count,
        args.from,
        args.plant.name(),
        started.elapsed()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
