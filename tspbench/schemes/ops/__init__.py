"""Building blocks several schemes share: token layouts, the weight ring, ring attention, decode attention,
vocabulary parallelism. Each scheme file under schemes/ holds only its own scheme."""
