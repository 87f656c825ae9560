"""Connections to the nodes: `ssh` (paramiko sessions and the pool), `connection` (the recorder every command
and file write goes through; it imports no paramiko, so the exporter can use it on a node), `streams`."""
