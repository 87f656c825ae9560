"""Code shipped to the nodes and run there by their own python3 or a container's (stdlib only, it imports nothing
of the kit's), and the rank control script."""

from pathlib import Path

SCRIPTS = Path(__file__).parent  # where the shipped files lie in the installed package
