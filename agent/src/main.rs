fn main() -> std::process::ExitCode {
    weft::main()
}
