"""The command line and the operator-facing parts of onceflow."""
