"""What a deployment is, as data (no I/O on nodes): the inventory and its fields, the profile it names, the
topology, the checkpoint, the credentials, the engine arguments and the served tokenizer."""
