//! `pagewise`: run programs on libpagewise.so and see where their memory went.
//!
//! Subcommands live in their own modules; `main` only parses and dispatches.

mod plot;
mod report;
mod run;

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
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => run::main(args),
    };
    std::process::exit(code);
}
