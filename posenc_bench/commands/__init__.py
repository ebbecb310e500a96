"""The command line: cli.py builds the parser; one module per command parses, calls the library, prints."""
