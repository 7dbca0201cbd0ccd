"""Sources: the demo generator that writes a landing zone to the contract."""
