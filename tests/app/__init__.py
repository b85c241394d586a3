"""Tests of onceflow.app (the folder mirrors the package)."""
