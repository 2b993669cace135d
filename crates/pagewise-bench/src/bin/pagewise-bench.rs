//! `pagewise-bench`: runs the suite before the `pagewise bench` CLI wiring
//! exists. Same flags as `pagewise bench`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "pagewise-bench",
    about = "Run the pagewise benchmark suite against other allocators"
)]
struct Cli {
    #[command(flatten)]
    args: pagewise_bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    match pagewise_bench::run(&cli.args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pagewise-bench: error: {e:#}");
            std::process::exit(2)
        }
    }
}
