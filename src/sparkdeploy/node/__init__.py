"""What a node is and holds: every on-node path (`layout`), the fact probes and their one parser (`probes`,
`facts`), the start-time memory guard; `scripts/` is the code that runs on the nodes themselves."""
