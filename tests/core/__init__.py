"""Tests of the core, `onceflow` (the folder mirrors the package)."""
