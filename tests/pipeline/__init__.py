"""Tests of onceflow.pipeline (the folder mirrors the package)."""
