//! `pagewise`: run programs on libpagewise.so and see where their memory went,
//! and benchmark pagewise against its peers.
//!
//! Subcommands live in their own modules; `main` only parses and dispatches.

mod elf;
mod plot;
mod profile;
mod report;
mod rss_sampler;
mod run;
mod trace;
mod tree;
mod tree_text;

use clap::{Parser, Subcommand};

/// The pagewise command line.
#[derive(Parser)]
#[command(name = "pagewise", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libpagewise.so preloaded and report its memory.
    Run(run::RunArgs),
    /// Run allocation workloads under pagewise and its peers (glibc, jemalloc, mimalloc, tcmalloc), side by side.
    Bench(pagewise_bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Bench(args) => match pagewise_bench::run(&args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("pagewise bench: {e:#}");
                2
            }
        },
    };
    std::process::exit(code);
}
