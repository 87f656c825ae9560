"""Checks before and beside a deployment: `doctor` (reads the nodes) and `preflight` (its pure checks), `init`
(an inventory from the boxes), and the `exporter` that serves a node's state to Prometheus."""
