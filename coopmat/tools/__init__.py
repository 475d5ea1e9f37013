"""Command-line tools beside the API: info, the benchmark and the codegen CLI."""
