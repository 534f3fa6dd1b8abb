"""Pure-Python parts of MuxConnector: config, load selection, breakers, finish accounting."""
