"""Assets, one module per layer: raw (as delivered), staging (validated, latest wins), marts."""
