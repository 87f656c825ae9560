"""Reads and effects on the nodes that the steps are built from: facts, releases, the registry, the live draft
list, weights, health, host setup, model fetch."""
