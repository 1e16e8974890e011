//! `hetccl-perf <collective> [flags]`, or `<collective>_perf [flags]` through
//! an argv[0] alias. See docs/perf.md.

fn main() {
    let code = hetccl_perf::launch::main_entry(std::env::args().collect());
    std::process::exit(code);
}
