"""`python -m tspbench.verify`: every scheme proven equal to the single-device model."""
