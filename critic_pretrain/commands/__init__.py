"""The commands: argparse and printing only, over the library below (one module per command)."""
