"""Shared test configuration: markers are declared in pyproject.toml."""
