"""Command-line programs: one module per command, each with build_parser() and main(argv)."""
